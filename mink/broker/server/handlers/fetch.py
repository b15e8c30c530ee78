"""Fetch: committed batches from the partitions' logs, long-polling on commits until
`min_bytes` are there or `max_wait` has passed.

Fetch sessions (KIP-227, `mink/broker/server/fetch_sessions.py`): a full fetch at epoch 0
opens one, and an incremental fetch names only what changed and is answered only with the
partitions that have something new.

The consumer byte-rate quota as Kafka's KafkaApis applies it: a fetch reads at most what
the quota allows in its windows, its response's bytes are charged, and a fetch that passes
the quota is answered without records (the bytes unrecorded), throttled.

Fetch through any node (issue 25): a consumer's Fetch (either isolation) of a partition this
node does not lead is served from a replica view (mink/broker/server/replica_reads.py), the
committed data read through the index and the object store; and KIP-392: a leader answers a
consumer in another rack than its own with `preferred_read_replica`, a live node in the
consumer's rack (`replica_selector`), and no records."""

from __future__ import annotations

import struct
import zlib

import trio
from kio.schema.errors import ErrorCode

from mink.broker.security.authorizer import READ
from mink.broker.server import fetch_sessions as sessions
from mink.broker.server.errors import error_for
from mink.broker.server.handlers.api_versions import NO_THROTTLE
from mink.broker.server.handlers.partitions import Located, check_leader_epoch, locate
from mink.broker.server.handlers.topic_ids import requested_topic
from mink.broker.transactions import read_committed
from mink.protocol.messages import build, nested, response_schema
from mink.storage.log import LogError
from mink.storage.replica import ReplicaView

TOPIC_IDS_FROM = 13  # Fetch v13+ (KIP-516) names topics by id only
RACK_ID_FROM = 11  # Fetch v11+ (KIP-392): the consumer's rack, preferred_read_replica
NO_REPLICA = -1
# Partitions of one Fetch read from the object store at the same time, at most.
COLD_PARTITIONS_AT_ONCE = 16


class _Read:
    __slots__ = ("topic", "topic_id", "request", "located", "error", "records", "size",
                 "aborted", "key", "preferred")

    def __init__(self, topic: str | None, topic_id, request, located, key=None):
        self.topic = topic
        self.topic_id = topic_id
        self.request = request  # the request's partition, or the session's CachedPartition
        self.located = located
        self.error = located.error
        self.records: list = []
        self.size = 0
        self.aborted: list = []  # read_committed: (producer id, first offset)
        self.key = key  # the partition's key in its fetch session
        self.preferred = NO_REPLICA  # KIP-392: where the consumer should fetch instead


class _SessionError(Exception):
    def __init__(self, error: ErrorCode) -> None:
        self.error = error


async def handle(node, ctx, request):
    ctx.applied()  # reads change nothing: later requests on the connection may start
    version = ctx.header.api_version
    try:
        session, incremental = _session_for(node, request, version)
    except _SessionError as exc:
        return _error_response(version, exc.error)
    if incremental:
        reads = [_read_of(node, key, cached, version)
                 for key, cached in session.partitions.items()]
    else:
        reads = _reads_of_request(node, request, version)
        if session is not None:
            for read in reads:
                session.partitions[read.key] = sessions.CachedPartition(read.request)
    _authorize(node, ctx, reads)
    deadline = trio.current_time() + request.max_wait.total_seconds()
    committed_only = request.isolation_level == read_committed.READ_COMMITTED
    from_consumer = _from_consumer(request)
    if from_consumer:
        await _serve_led_elsewhere(node, reads)
        if version >= RACK_ID_FROM:
            _prefer_rack_local(node, request.rack_id, reads)
    quota = node.quotas.fetch
    user, client_id = ctx.principal.name, ctx.client_id
    max_bytes = request.max_bytes
    charged = bool(quota.limits) and not ctx.quota_exempt
    if charged:
        max_bytes = int(min(max_bytes, quota.max_value_in_window(user, client_id)))
    changed = None  # the logs that committed since the last read; None: read them all
    moved: set[_Read] = set()  # reads sent to a view after their log closed under the fetch
    while True:
        total = await _read_all(reads, max_bytes, committed_only, changed)
        closed = [r for r in reads
                  if r.error == ErrorCode.not_leader_or_follower and r not in moved]
        if from_consumer and closed:
            # a log closed under the fetch (its partition moved away): those partitions are
            # read from views instead of answering NOT_LEADER_OR_FOLLOWER, each once (a
            # rebalance closes a node's logs one after the other, while the fetch waits)
            moved.update(closed)
            if await _serve_led_elsewhere(node, closed):
                changed = None
                continue
        if total >= request.min_bytes or trio.current_time() >= deadline or (
                any(r.error or r.preferred != NO_REPLICA for r in reads)):
            break  # Kafka answers a preferred read replica at once too
        changed = await _wait_for_commit(node, reads, deadline)
    if charged:
        now = trio.current_time()
        size = sum(r.size for r in reads)
        ctx.throttle = quota.record(user, client_id, size, now)
        if ctx.throttle > 0:  # Kafka's getThrottledResponse: no records, bytes unrecorded
            quota.unrecord(user, client_id, size, now)
            for read in reads:
                read.records, read.size = [], 0
            if incremental:  # no partition, the session's answers left as they were
                reads = []
    if committed_only:
        await _find_aborted(node, reads)
    if session is not None:
        reads = _answered_in_session(session, reads, incremental)
    session_id = session.id if session is not None else sessions.INVALID_SESSION_ID
    return _response(node, version, reads, session_id, ctx.listener_name)


def _authorize(node, ctx, reads: list[_Read]) -> None:
    """READ on each topic, asked before whether it exists (Kafka's order)."""
    if not node.authorizer.enabled:
        return
    for read in reads:
        if read.topic is not None and not node.authorizer.topic(ctx, READ, read.topic):
            read.located = Located(ErrorCode.topic_authorization_failed)
            read.error = ErrorCode.topic_authorization_failed


def _from_consumer(request) -> bool:
    """A consumer's Fetch (replica id -1), not a follower's: only those are served from a
    replica view or pointed to another replica."""
    state = getattr(request, "replica_state", None)  # v15+ (KIP-903)
    replica_id = state.replica_id if state is not None else getattr(request, "replica_id", -1)
    return replica_id < 0


async def _serve_led_elsewhere(node, reads: list[_Read]) -> bool:
    """The reads of partitions another node leads, or this node leads and is still opening
    (NOT_LEADER_OR_FOLLOWER so far), get this node's replica views of them, with the leader
    epoch checked as a Kafka follower checks it (KIP-320). Those PostgreSQL does not know
    stay NOT_LEADER_OR_FOLLOWER. Whether any read got a view."""
    elsewhere = [r for r in reads if r.error == ErrorCode.not_leader_or_follower
                 and r.located.partition is not None]
    if not elsewhere:
        return False
    served = False
    replicas = node.replica_reads
    views = await replicas.views_for(
        list(dict.fromkeys((r.located.topic.topic_id, r.request.partition) for r in elsewhere)))
    # past the end a view knows: read the ends again before answering OFFSET_OUT_OF_RANGE
    ahead = [key for r in elsewhere
             if (key := (r.located.topic.topic_id, r.request.partition)) in views
             and r.request.fetch_offset > views[key].committed_end]
    if ahead:
        views.update(await replicas.views_for(list(dict.fromkeys(ahead)), max_age=0))
    for read in elsewhere:
        view = views.get((read.located.topic.topic_id, read.request.partition))
        if view is None:
            continue
        located = read.located
        read.located = Located(ErrorCode.none, located.topic, located.partition, view)
        read.error = check_leader_epoch(
            getattr(read.request, "current_leader_epoch", -1), view)
        node.replica_reads.fetches_served += 1
        served = True
    return served


def _prefer_rack_local(node, rack_id: str | None, reads: list[_Read]) -> None:
    """KIP-392 as Kafka's RackAwareReplicaSelector: for a consumer in a rack the leader is
    not in, a live node of that rack (not draining; the same one for a partition every time,
    partitions spread over them). None there: the leader serves."""
    rack = node.config.rack
    if node.config.replica_selector != "rack" or not rack_id or rack_id == rack:
        return
    in_rack = sorted(b.node_id for b in node.view.brokers.values()
                     if b.rack == rack_id and not b.draining and b.node_id != node.node_id)
    if not in_rack:
        return
    for read in reads:
        if not read.error and read.located.log is not None and not isinstance(
                read.located.log, ReplicaView):
            spread = zlib.crc32(f"{read.topic}/{read.request.partition}".encode())
            read.preferred = in_rack[spread % len(in_rack)]


def _session_for(node, request, version: int):
    """(session or None, incremental?) for the request's session id and epoch; the request's
    changes are applied to an incremental fetch's session."""
    cache = node.fetch_sessions
    session_id, epoch = request.session_id, request.session_epoch
    if version < 7:
        return None, False
    now = trio.current_time()
    if epoch in (sessions.INITIAL_EPOCH, sessions.FINAL_EPOCH):
        if session_id != sessions.INVALID_SESSION_ID:
            cache.remove(session_id)
        if epoch == sessions.FINAL_EPOCH:
            return None, False
        return cache.create(version >= TOPIC_IDS_FROM, now), False
    if epoch < 0:
        raise _SessionError(ErrorCode.invalid_fetch_session_epoch)
    session = cache.get(session_id, now)
    if session is None:
        raise _SessionError(ErrorCode.fetch_session_id_not_found)
    if session.epoch != epoch:
        raise _SessionError(ErrorCode.invalid_fetch_session_epoch)
    if session.uses_topic_ids != (version >= TOPIC_IDS_FROM):
        raise _SessionError(ErrorCode.fetch_session_topic_id_error)
    uses_ids = session.uses_topic_ids
    for topic in request.topics:
        name = topic.topic_id if uses_ids else topic.topic
        for p in topic.partitions:
            cached = session.partitions.get((name, p.partition))
            if cached is None:
                session.partitions[(name, p.partition)] = sessions.CachedPartition(p)
            else:
                cached.update(p)
    for topic in request.forgotten_topics_data:
        name = topic.topic_id if uses_ids else topic.topic
        for index in topic.partitions:
            session.partitions.pop((name, index), None)
    session.epoch = sessions.next_epoch(session.epoch)
    return session, True


def _reads_of_request(node, request, version: int) -> list[_Read]:
    reads = []
    for topic in request.topics:
        # v13+ (KIP-516) names the topic by id only
        name, topic_id, unknown = requested_topic(node.view, getattr(topic, "topic", None),
                                                  getattr(topic, "topic_id", None))
        key_topic = topic_id if version >= TOPIC_IDS_FROM else name
        for p in topic.partitions:
            reads.append(_located_read(node, name, topic_id, unknown, p,
                                       (key_topic, p.partition)))
    return reads


def _read_of(node, key, cached, version: int) -> _Read:
    """A session partition, resolved against the current view (it may have been deleted)."""
    if version >= TOPIC_IDS_FROM:
        name, topic_id, unknown = requested_topic(node.view, None, key[0])
    else:
        name, topic_id, unknown = requested_topic(node.view, key[0], None)
    return _located_read(node, name, topic_id, unknown, cached, key)


def _located_read(node, name, topic_id, unknown, partition_request, key) -> _Read:
    located = Located(unknown) if unknown else locate(node, name, partition_request.partition)
    read = _Read(name, topic_id, partition_request, located, key)
    if located.log is not None:
        read.error = check_leader_epoch(
            getattr(partition_request, "current_leader_epoch", -1), located.log)
    return read


def _answered_in_session(session, reads: list[_Read], incremental: bool) -> list[_Read]:
    """The reads the answer carries: all of a full fetch's, an incremental fetch's with
    something new. Each one answered is remembered and moves to the end of the session."""
    answered = []
    for read in reads:
        cached = session.partitions.get(read.key)
        if cached is None:
            continue
        partition_log = read.located.log
        high_watermark = partition_log.high_watermark if partition_log is not None else -1
        log_start = partition_log.log_start_offset if partition_log is not None else -1
        if cached.must_respond(bool(read.records), read.error, high_watermark, log_start) or (
                not incremental) or read.preferred != NO_REPLICA:
            answered.append(read)
            session.answered(read.key)
    return answered


def _error_response(version: int, error: ErrorCode):
    schema = response_schema(1, version)
    return build(schema, throttle_time=NO_THROTTLE, error_code=error,
                 session_id=sessions.INVALID_SESSION_ID, responses=(), node_endpoints=())


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


async def _read_all(reads: list[_Read], max_bytes: int, committed_only: bool = False,
                    changed: set | None = None) -> int:
    """Read every partition, or after a wake-up (`changed`) only those whose log committed
    since: a log that committed nothing would answer the same again, unless the budget left
    for it shrank below what it gave last time."""
    early = await _read_cold_at_once(reads, max_bytes, changed)
    total = 0
    for read in reads:
        if read.error or read.preferred != NO_REPLICA:  # KIP-392: no records with it
            read.records, read.size = [], 0
            continue
        budget = min(read.request.partition_max_bytes, max_bytes - total)
        if changed is not None and read.located.log not in changed and (
                read.size == 0 or read.size <= budget):
            total += read.size
            continue
        read.records, read.size = [], 0
        if budget <= 0 and total > 0:
            continue  # the response is full; the first batch of a fetch is always sent
        try:
            got = early.pop(read, None)
            if got is not None and got[0] == max(budget, 1):
                if isinstance(got[1], LogError):
                    raise got[1]
                read.records = got[1]
            else:
                read.records = await read.located.log.read(read.request.fetch_offset,
                                                           max(budget, 1))
        except LogError as exc:
            read.error = error_for(exc)
            continue
        if committed_only:  # read_committed: nothing at or past the last stable offset
            read.records = read_committed.below_stable_offset(
                read.records, read.located.log.last_stable_offset)
        read.size = sum(len(r) for r in read.records)
        if read.size > budget and total > 0:
            # Only the first partition with data may go past the budget, with its first
            # batch (Kafka's minOneMessage): a later one keeps it for the next fetch, or
            # the response outgrows fetch.max.bytes and librdkafka refuses it whole.
            read.records, read.size = [], 0
        total += read.size
    return total


async def _read_cold_at_once(reads: list[_Read], max_bytes: int,
                             changed: set | None) -> dict:
    """The partitions of a fetch whose reads go to the object store are read at the same
    time, not one after the other (a catch-up consumer of several partitions waited out each
    partition's GETs in turn): each with the budget it gets when every partition before it
    fills its own, which _read_all then uses (else it reads again, from the caches)."""
    cold = [r for r in reads if not r.error and r.preferred == NO_REPLICA
            and (changed is None or r.located.log in changed)
            and r.located.log.reads_cold(r.request.fetch_offset)]
    if len(cold) < 2:
        return {}
    early: dict = {}
    limiter = trio.CapacityLimiter(COLD_PARTITIONS_AT_ONCE)

    async def read_early(read: _Read, budget: int) -> None:
        async with limiter:
            try:
                early[read] = (budget, await read.located.log.read(read.request.fetch_offset,
                                                                   budget))
            except LogError as exc:
                early[read] = (budget, exc)

    async with trio.open_nursery() as nursery:
        planned = 0
        for read in cold:  # no more than the response can hold
            budget = max(min(read.request.partition_max_bytes, max_bytes), 1)
            nursery.start_soon(read_early, read, budget)
            planned += budget
            if planned >= max_bytes:
                break
    return early


class _Waiter:
    """What a log wakes at its commits (it calls `set()`): records which log it was."""

    __slots__ = ("log", "woken", "changed")

    def __init__(self, partition_log, woken: trio.Event, changed: set) -> None:
        self.log, self.woken, self.changed = partition_log, woken, changed

    def set(self) -> None:
        self.changed.add(self.log)
        self.woken.set()


async def _wait_for_commit(node, reads: list[_Read], deadline: float) -> set:
    """The logs that committed before the deadline (empty if none did). A replica view
    learns of commits from the node's poller, which polls while someone waits."""
    woken, changed = trio.Event(), set()
    waiters = [_Waiter(r.located.log, woken, changed) for r in reads
               if r.located.log is not None]
    for waiter in waiters:
        waiter.log.waiters.add(waiter)
    if any(isinstance(w.log, ReplicaView) for w in waiters):
        node.replica_reads.waiting()
    try:
        with trio.move_on_at(deadline):
            await woken.wait()
    finally:
        for waiter in waiters:
            waiter.log.waiters.discard(waiter)
    return changed


def _response(node, version: int, reads: list[_Read], session_id: int,
              listener: str | None = None):
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
            preferred_read_replica=read.preferred,
            # the stored buffers themselves: the frame is sent around them, not joined
            records=tuple(read.records) if read.records else b"", **extra))
    topic_schema = nested(schema, "FetchableTopicResponse")
    return build(schema, throttle_time=NO_THROTTLE, error_code=ErrorCode.none,
                 session_id=session_id,
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
