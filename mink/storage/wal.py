"""The epoch-fenced WAL (DESIGN, "Write path"): where a batch is made durable.

Appends of many partitions collect in one buffer. A flush seals the buffer into one
immutable object, `wal/<node>/<node epoch>/<seq>`, created if absent. Uploads may overlap
(bounded); commits go to PostgreSQL in sequence order, several uploaded objects per round
trip. Only a commit acknowledges an append. A range the commit refuses means this node lost
that partition; a failed upload fails the partition's later appends too and rewinds its next
offset to the committed end. A commit whose outcome is unknown (timeout, lost connection)
freezes its partitions and is repeated until PostgreSQL answers: CommitWal is keyed by the
object key, so a repeat returns the first outcome. Nothing is guessed.
"""

from __future__ import annotations

import collections
import logging
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
import trio

from mink.storage.controlplane import (
    MetadataError,
    MetadataRejected,
    MetadataUnavailable,
    StaleEpoch,
    WalObject,
    WalRange,
)
from mink.storage.lifecycle.store import mark_wal_decided
from mink.storage.log import (
    Chunk,
    NotLeader,
    PartitionLog,
    PendingAppend,
    StorageUnavailable,
)
from mink.storage.objectstore import ObjectStoreError
from mink.storage.objectstore.base import WAL_PREFIX
from mink.storage.observer import NO_OBSERVER, StorageObserver

log = logging.getLogger(__name__)

# How often the writer records how far its objects are decided (wal_settled, sql/0009): a
# restart after a crash lists only the objects after that mark, the last seconds' worth.
DECIDED_MARK_INTERVAL = 5.0

FOOTER_MAGIC = b"MWAL"
REJECTED = "rejected_by_postgresql"  # a commit PostgreSQL refused with an error of its own
_FOOTER_TRAILER = struct.Struct(">I4s")


class FooterRange(msgspec.Struct, array_like=True):
    topic_id: str
    partition: int
    leader_epoch: int
    base_offset: int
    last_offset: int
    byte_start: int
    byte_end: int


class Footer(msgspec.Struct):
    """Indexes the object by itself, for tools and tiering; readers use PostgreSQL's index."""

    node_id: int
    node_epoch: int
    ranges: list[FooterRange]


def wal_key(node_id: int, node_epoch: int, seq: int) -> str:
    return f"{WAL_PREFIX}{node_id}/{node_epoch}/{seq:012d}"


@dataclass(eq=False, slots=True)
class _Entry:
    pending: PendingAppend
    data: bytearray
    max_timestamp: int
    batch_count: int
    producer_states: list


@dataclass(eq=False)
class _Range:
    log: PartitionLog
    generation: int
    entries: list[_Entry]
    byte_start: int
    byte_end: int

    @property
    def base_offset(self) -> int:
        return self.entries[0].pending.base_offset

    @property
    def last_offset(self) -> int:
        return self.entries[-1].pending.last_offset

    def is_current(self) -> bool:
        return self.log.closed is None and self.generation == self.log.generation

    def as_wal_range(self) -> WalRange:
        states: dict[int, object] = {}
        for entry in self.entries:
            for state in entry.producer_states:
                states[state.producer_id] = state  # the latest state of each producer
        return WalRange(
            topic_id=self.log.topic_id, partition=self.log.partition,
            leader_epoch=self.log.leader_epoch, base_offset=self.base_offset,
            last_offset=self.last_offset, byte_start=self.byte_start, byte_end=self.byte_end,
            max_timestamp=max(e.max_timestamp for e in self.entries),
            batch_count=sum(e.batch_count for e in self.entries),
            producer_states=list(states.values()))

    def chunks(self) -> list[Chunk]:
        return [Chunk(e.pending.base_offset, e.pending.last_offset, e.data)
                for e in self.entries]


@dataclass(eq=False)
class _WalObject:
    seq: int
    key: str
    ranges: list[_Range]
    parts: list
    size: int
    data_bytes: int
    uploaded: trio.Event = field(default_factory=trio.Event)
    upload_error: Exception | None = None
    # The ranges sent to CommitWal, in request order (None until it is sent).
    requested: list[_Range] | None = None


class WalWriter:
    def __init__(self, node_id: int, node_epoch: int, objects, metadata, *,
                 max_bytes: int = 8 * 1024 * 1024, max_delay: float = 0.0,
                 max_uploads: int = 1, concurrent_upload_min_bytes: int = 0,
                 commit_timeout: float = 10.0,
                 max_buffered_bytes: int | None = None,
                 on_fenced: Callable[[PartitionLog, str], None] | None = None,
                 observer: StorageObserver = NO_OBSERVER) -> None:
        self.node_id = node_id
        self.observer = observer  # metrics: one call per upload and per commit
        self.node_epoch = node_epoch
        self.objects = objects
        self.metadata = metadata
        self.max_bytes = max_bytes
        self.max_delay = max_delay
        self.commit_timeout = commit_timeout
        self.max_buffered_bytes = max_buffered_bytes or max_bytes * (max_uploads + 4)
        self.on_fenced = on_fenced or (lambda _log, _reason: None)
        self._upload_slots = trio.Semaphore(max_uploads, max_value=max_uploads)
        # An upload beyond the first starts only once this much waits in the buffer.
        self.concurrent_upload_min_bytes = concurrent_upload_min_bytes
        self._buffer: dict[PartitionLog, list[_Entry]] = {}
        self._buffer_bytes = 0
        self._buffer_started = 0.0
        self._unflushed_bytes = 0  # buffered plus uploading plus waiting for commit
        self._data_added = trio.Event()
        self._room = trio.Event()
        self._in_flight: collections.deque[_WalObject] = collections.deque()
        self._object_uploaded = trio.Event()
        self._seq = 0
        self._committing: list[_WalObject] = []
        self.stopped = False
        # every object up to this seq is decided in PostgreSQL (commits run in seq order),
        # unless `_undecided_left` (an abandonment that could not be recorded): then the
        # mark stays where it was and a restart's listing finds that object
        self._decided_through = 0
        self._undecided_left = False
        self._marked_through = 0

    # -- called by PartitionLog.append, synchronously -------------------------------------

    def add(self, log_: PartitionLog, pending: PendingAppend, data: bytearray,
            max_timestamp: int, batch_count: int, producer_states: list) -> None:
        if not self._buffer:
            self._buffer_started = trio.current_time()
        self._buffer.setdefault(log_, []).append(
            _Entry(pending, data, max_timestamp, batch_count, producer_states))
        self._buffer_bytes += len(data)
        self._unflushed_bytes += len(data)
        self._data_added.set()

    @property
    def has_room(self) -> bool:
        """True when `wait_for_room` would return at once."""
        return self._unflushed_bytes < self.max_buffered_bytes and not self.stopped

    async def wait_for_room(self) -> None:
        """Back-pressure: wait while too many bytes wait for their commit. Raises NotLeader
        once the writer stopped (this node stopped leading): nothing would make room."""
        while not self.has_room and not self.stopped:
            await self._room.wait()
        if self.stopped:
            raise NotLeader("this node stopped leading")

    @property
    def objects_in_flight(self) -> int:
        """WAL objects uploading or waiting for their commit."""
        return len(self._in_flight) + len(self._committing)

    @property
    def unflushed_bytes(self) -> int:
        """Bytes appended and not yet committed (buffered, uploading or committing)."""
        return self._unflushed_bytes

    def stop(self) -> None:
        self.stopped = True
        self._room.set()

    # -- background -----------------------------------------------------------------------

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._flush_loop, nursery)
            nursery.start_soon(self._commit_loop)
            nursery.start_soon(self._mark_loop)
            task_status.started()

    async def _wait_for_data(self) -> None:
        await self._data_added.wait()
        self._data_added = trio.Event()

    async def _flush_loop(self, nursery: trio.Nursery) -> None:
        while True:
            while not self._buffer:
                await self._wait_for_data()
            if self.max_delay > 0:
                # On S3 every PUT is paid for: let the buffer fill for up to max_delay.
                with trio.move_on_at(self._buffer_started + self.max_delay):
                    while self._buffer_bytes < self.max_bytes:
                        await self._wait_for_data()
            # On file:// a second upload starts only for a buffer worth its fsync: at low
            # rates one at a time keeps fsyncs from waiting on each other in the file
            # system's journal; under load the next object uploads while the last syncs.
            while (self._upload_slots.value < self._upload_slots.max_value
                   and self._buffer_bytes < self.concurrent_upload_min_bytes):
                await self._wait_for_data()  # or for the running upload's end
            # Waiting for a slot lets the buffer grow: group commit under load.
            await self._upload_slots.acquire()
            obj = self._seal()
            if obj is None:
                self._upload_slots.release()
                continue
            self._in_flight.append(obj)
            nursery.start_soon(self._upload, obj)

    def _seal(self) -> _WalObject | None:
        buffer, self._buffer = self._buffer, {}
        buffered, self._buffer_bytes = self._buffer_bytes, 0
        parts: list = []
        ranges: list[_Range] = []
        position = 0
        for log_, entries in buffer.items():
            # Appends failed by a reset since they were buffered are dropped here.
            live = [e for e in entries if not e.pending.done.is_set()
                    and e.pending.generation == log_.generation]
            if not live or log_.closed is not None:
                continue
            start = position
            for entry in live:
                entry.pending.sealed = True
                parts.append(entry.data)
                position += len(entry.data)
            ranges.append(_Range(log_, log_.generation, live, start, position))
        self._unflushed_bytes -= buffered - position  # what was dropped
        self._signal_room()
        if not ranges:
            return None
        footer = msgspec.msgpack.encode(Footer(self.node_id, self.node_epoch, [
            FooterRange(str(r.log.topic_id), r.log.partition, r.log.leader_epoch,
                        r.base_offset, r.last_offset, r.byte_start, r.byte_end)
            for r in ranges]))
        parts.append(footer)
        parts.append(_FOOTER_TRAILER.pack(len(footer), FOOTER_MAGIC))
        self._seq += 1
        size = position + len(footer) + _FOOTER_TRAILER.size
        return _WalObject(self._seq, wal_key(self.node_id, self.node_epoch, self._seq),
                          ranges, parts, size, position)

    async def _upload(self, obj: _WalObject) -> None:
        started = trio.current_time()
        try:
            await self.objects.create(obj.key, obj.parts)
            self.observer.wal_uploaded(obj.size, trio.current_time() - started, False)
        except Exception as exc:  # any failure is a failed upload, never a dead node
            self.observer.wal_uploaded(obj.size, trio.current_time() - started, True)
            if not isinstance(exc, ObjectStoreError):
                log.exception("upload of %s failed unexpectedly", obj.key)
            else:
                log.warning("upload of %s failed: %s", obj.key, exc)
            obj.upload_error = exc
        finally:
            self._data_added.set()  # the flush loop may be waiting for this end
            self._upload_slots.release()
            obj.uploaded.set()
            self._object_uploaded.set()

    async def _commit_loop(self) -> None:
        while True:
            while not (self._in_flight and self._in_flight[0].uploaded.is_set()):
                await self._object_uploaded.wait()
                self._object_uploaded = trio.Event()
            ready: list[_WalObject] = []
            while self._in_flight and self._in_flight[0].uploaded.is_set():
                ready.append(self._in_flight.popleft())
            self._committing = ready
            await self._commit(ready)
            self._committing = []
            if not self._undecided_left:
                self._decided_through = ready[-1].seq
            self._unflushed_bytes -= sum(obj.data_bytes for obj in ready)
            self._signal_room()

    async def _mark_loop(self) -> None:
        while True:
            await trio.sleep(DECIDED_MARK_INTERVAL)
            through = self._decided_through
            if through <= self._marked_through:
                continue
            try:
                with trio.move_on_after(self.commit_timeout):
                    await mark_wal_decided(self.metadata, self.node_id, self.node_epoch,
                                           through)
                    self._marked_through = through
            except MetadataError as exc:  # only a longer listing at the next restart
                log.debug("could not record the WAL objects decided: %s", exc)

    def _signal_room(self) -> None:
        if self._unflushed_bytes < self.max_buffered_bytes:
            self._room.set()
            self._room = trio.Event()

    async def _commit(self, ready: list[_WalObject]) -> None:
        to_commit: list[tuple[_WalObject, list[_Range]]] = []
        for obj in ready:
            if obj.upload_error is not None:
                for r in obj.ranges:
                    if r.is_current():
                        r.log.reset(StorageUnavailable(f"upload failed: {obj.upload_error}"),
                                    from_offset=r.base_offset)
                    else:
                        _not_committed(r, "its upload failed")
                # It may have landed after all (an answer lost): never let it be committed.
                await self._queue_deletion([obj.key], "upload failed")
                continue
            # Ranges failed by an earlier reset are never committed, so a rewound
            # partition cannot see an old range land on its new offsets. Appends of a
            # partition closed meanwhile are never sent: definitely not committed.
            live = [r for r in obj.ranges if r.is_current()]
            for r in obj.ranges:
                if not r.is_current():
                    _not_committed(r, "the partition closed before its commit")
            if live:
                obj.requested = live
                to_commit.append((obj, live))
            else:
                await self._queue_deletion([obj.key], "wal object with no live range")
        if not to_commit:
            return
        request = [WalObject(key=obj.key, size=obj.size,
                             ranges=[r.as_wal_range() for r in live])
                   for obj, live in to_commit]
        started = trio.current_time()
        outcomes = await self._commit_until_known(request, [r for _, live in to_commit
                                                            for r in live])
        self.observer.wal_committed(
            trio.current_time() - started,
            sum(1 for outcome in outcomes for result in outcome.ranges if result.accepted),
            [result.reason for outcome in outcomes for result in outcome.ranges
             if not result.accepted])
        for (obj, live), outcome in zip(to_commit, outcomes, strict=True):
            if outcome.ranges and outcome.ranges[0].reason == REJECTED:
                # Not written, and not a lost partition: its appends fail retriably and
                # the partition rewinds, as after a failed upload.
                for r in live:
                    if r.is_current():
                        r.log.reset(StorageUnavailable("commit rejected by PostgreSQL"),
                                    from_offset=r.base_offset)
                    else:
                        _not_committed(r, "commit rejected by PostgreSQL")
                await self._queue_deletion([obj.key], "commit rejected")
                continue
            for r, result in zip(live, outcome.ranges, strict=True):
                if result.accepted:
                    r.log.committed(r.chunks())
                else:
                    refused = NotLeader(f"commit refused: {result.reason}")
                    for entry in r.entries:  # known outcome: refused, not in doubt
                        entry.pending.resolve(refused)
                    self._fenced(r.log, result.reason)
        for (obj, _), outcome in zip(to_commit, outcomes, strict=True):
            rejected = bool(outcome.ranges) and outcome.ranges[0].reason == REJECTED
            if not rejected and not any(r.accepted for r in outcome.ranges):
                # Nothing of it is used. PostgreSQL queues most refused objects itself, but a
                # stale node epoch is refused before anything is recorded: queue it here
                # (abandoned first, so it can never be committed once deleted).
                await self._queue_deletion([obj.key], "refused at commit")

    async def settle_after_stop(self) -> None:
        """After stop(): the appends still waiting in WAL objects that were uploading or being
        committed get their real outcome, read back from PostgreSQL (which also settles it: a
        key nobody decided on is abandoned, so a late CommitWal of it is refused). Run by the
        node, which outlives this writer; repeated until PostgreSQL answers, so producers
        whose requests are still waiting are answered with what happened, across
        self-fencing and re-registration, and never with a guess."""
        objects = [obj for obj in [*self._committing, *self._in_flight]
                   if any(not e.pending.done.is_set() for r in obj.ranges for e in r.entries)]
        if not objects:
            return
        keys = [obj.key for obj in objects]
        delay = 0.1
        while True:
            outcomes = None
            with trio.move_on_after(self.commit_timeout):
                try:
                    outcomes = await self.metadata.commit_outcome(keys, settle=True)
                except MetadataError as exc:
                    log.warning("reading back the outcome of %d WAL objects failed: %s",
                                len(keys), exc)
            if outcomes is not None:
                break
            await trio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 2.0)
        for obj in objects:
            outcome = outcomes.get(obj.key)
            accepted: set[int] = set()
            if outcome is not None and outcome.committed and obj.requested is not None:
                for r, result in zip(obj.requested, outcome.ranges, strict=False):
                    if result.accepted:
                        accepted.add(id(r))
                        r.log.committed(r.chunks())
            for r in obj.ranges:
                if id(r) not in accepted:
                    _not_committed(r, "not committed (read back after this node stopped "
                                      "leading)")
        log.info("read back the outcome of %d WAL objects after stopping", len(objects))

    def _fenced(self, log_: PartitionLog, reason: str) -> None:
        if log_.closed is None:
            log.warning("partition %s-%d refused at commit (%s): closing it", log_.topic_id,
                        log_.partition, reason,
                        extra={"event": "commit_refused", "topic_id": str(log_.topic_id),
                               "partition": log_.partition, "leader_epoch": log_.leader_epoch,
                               "reason": reason})
            log_.close(NotLeader(f"commit refused: {reason}"))
            self.on_fenced(log_, reason)

    async def _commit_until_known(self, request: list[WalObject], ranges: list[_Range]):
        """CommitWal, shielded, with its own deadline; repeated until its outcome is known."""
        delay = 0.05
        frozen: list[PartitionLog] = []
        try:
            while True:
                with trio.CancelScope(shield=True):
                    with trio.move_on_after(self.commit_timeout):
                        try:
                            return await self.metadata.commit_wal(self.node_id,
                                                                  self.node_epoch, request)
                        except StaleEpoch as exc:
                            # The whole node was fenced: every range is refused.
                            return [_refused_whole(obj, exc.reason) for obj in request]
                        except MetadataRejected as exc:
                            # PostgreSQL refused the statement itself (a data exception):
                            # rolled back, so definitely not committed. Repeating it would
                            # fail the same way and hold up every later commit.
                            log.error("commit of %s rejected by PostgreSQL: %s",
                                      request[0].key, exc)
                            return [_refused_whole(obj, REJECTED) for obj in request]
                        except MetadataUnavailable as exc:
                            log.warning("commit of %s in doubt: %s", request[0].key, exc)
                        except Exception:  # unknown: treat as in doubt, repeat, never guess
                            log.exception("commit of %s failed unexpectedly; repeating",
                                          request[0].key)
                    log.warning("commit of %d WAL objects in doubt; repeating",
                                len(request))
                    self.observer.wal_commit_in_doubt()
                if not frozen:
                    for r in ranges:
                        if not r.log.frozen:
                            r.log.frozen = True
                            frozen.append(r.log)
                await trio.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 2.0)
        finally:
            for log_ in frozen:
                log_.frozen = False

    async def _queue_deletion(self, keys: list[str], reason: str) -> None:
        queued = False
        try:
            with trio.move_on_after(self.commit_timeout):
                await self.metadata.queue_for_deletion(keys, reason)
                queued = True
        except Exception as exc:  # a node restart settles them (Streams.settle_orphans)
            log.warning("could not queue %s for deletion: %s", keys, exc)
        if not queued:
            self._undecided_left = True


def _not_committed(r: _Range, why: str) -> None:
    """A range that was definitely not committed: its waiting appends fail, retriably."""
    error = NotLeader(why)
    for entry in r.entries:
        entry.pending.resolve(error)


@dataclass
class _RangeResult:
    accepted: bool
    reason: str


@dataclass
class _ObjectResult:
    ranges: list[_RangeResult]


def _refused_whole(obj: WalObject, reason: str) -> _ObjectResult:
    return _ObjectResult([_RangeResult(False, reason) for _ in obj.ranges])

