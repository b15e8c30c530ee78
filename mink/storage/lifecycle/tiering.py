"""Tiering (seed 000's tiering worker), the storage side: committed WAL data of a partition is
rewritten into stream objects (`mink/storage/stream_object.py`) and the index rows they cover
are swapped for one row each (`mink_swap_stream_object_rows`, sql/0030: the swap of
sql/0011_tiering.sql behind 0014's fences).

One stream object is one job, every step fenced by the coordinator lease epoch the round
carries and by the topic's writer lease (sql/0014_tiering_writers.sql): a round handed to the
writer-lease holder carries (its node id, that lease's epoch); a coordinator's own round for a
topic nobody holds the writer lease of carries none, and is refused once somebody does:

1. begin: the upload is recorded (`stream_object_uploads`) before anything is written; a
   job that ends short of its swap (refused, failed, cancelled) gives it up at once, and
   the upload of a node that died is found and deleted later (`sweep_uploads`);
2. the rows' byte ranges are read from their WAL objects (ranged GETs) and checked to be
   whole batches that follow each other; on file:// only their batch headers are read;
3. the stream object is created (create-if-absent, a key no other attempt uses); on
   file:// the store copies it together from the WAL objects' ranges (`compose`);
4. the swap: one transaction replaces exactly the rows read with one row for the object, or
   refuses (stale coordinator or writer lease epoch, rows changed by retention meanwhile,
   partition gone) and changes nothing in the index. WAL objects whose last row went are
   released to the lifecycle's collection, which deletes them after file.delete.delay.ms.

Nothing here deletes an object: a refused or abandoned upload goes to objects_to_delete, and
only an object no index row uses is ever queued. The broker's loop that schedules rounds on
the coordinator lease holder is `mink/broker/cluster/tiering.py`.
"""

from __future__ import annotations

import functools
import logging
import math
import secrets
import uuid
from dataclasses import dataclass, field

import msgspec
import trio

from mink.protocol.records import LOG_OVERHEAD, RECORD_BATCH_OVERHEAD
from mink.storage.controlplane import MetadataStore
from mink.storage.controlplane.postgres import IDEMPOTENT, READ
from mink.storage.lifecycle import tiering_child
from mink.storage.objectstore.base import ObjectRange
from mink.storage.stream_object import (
    DEFAULT_INDEX_INTERVAL,
    StreamObjectError,
    StreamObjectWriter,
    read_batch_header,
    stream_object_key,
)

log = logging.getLogger(__name__)

# WAL rows read per round (the rest waits for the next round).
PLAN_ROWS = 20_000
# Rows per planning query (wal_row_pages). psycopg decodes a page in one step of the event
# loop: 1,000 rows took up to 14 ms, and a leader's commits beside rounds had a p99 about 1 ms
# higher than with 200 (benchmarks/results/tiering-commit-latency-pages-20261207.md).
PAGE_ROWS = 200
_FIRST_TOPIC = uuid.UUID(int=0)
# Ranged GETs in flight for one stream object (a store that cannot compose).
READ_CONCURRENCY = 8
# The stream object is assembled in steps of this many bytes, each step a checkpoint, so a
# large object's batch walk does not hold the event loop in one step.
ASSEMBLY_STEP_BYTES = 1024 * 1024
# A store that composes objects from other objects' ranges (file://: `scan` and `compose`)
# is not read into memory: the rows' batch headers are read through a window of this many
# bytes (a row of small batches in one read, a large batch's header without its records),
# and the object is copied together by the store.
WALK_WINDOW = 64 * 1024

# Rows retention is about to delete are left out (`kept_ms`: topic -> a row is planned only
# if its running max timestamp is at most that old, i.e. retention keeps it long enough
# for a round): a plan starting at such a row would lose its first rows to retention before
# its swap and be refused whole (index_changed), round after round.
_EXPIRING = """
  LEFT JOIN unnest(%(kept_topics)s::uuid[], %(kept_ms)s::bigint[]) AS k(topic_id, ms)
         ON k.topic_id = b.topic_id"""
_NOT_EXPIRING = """
   AND (k.ms IS NULL OR b.running_max_timestamp
                        >= (extract(epoch FROM now()) * 1000)::bigint - k.ms)"""
# Keyset paging (wal_row_pages): the rows after the previous page's last.
_AFTER = """
   AND (b.topic_id, b.partition, b.base_offset)
       > (%(after_topic)s::uuid, %(after_partition)s::int, %(after_offset)s::bigint)"""
SQL_WAL_ROWS = """
SELECT b.topic_id, b.partition, b.base_offset, b.last_offset, b.object_key, b.byte_start,
       b.byte_end, coalesce(w.decided_at <= now() - %(min_age)s * interval '1 second', true)
  FROM batch_index AS b
  LEFT JOIN wal_objects AS w ON w.key = b.object_key""" + _EXPIRING + """
 WHERE b.object_key LIKE 'wal/%%'""" + _NOT_EXPIRING + _AFTER + """
 ORDER BY b.topic_id, b.partition, b.base_offset
 LIMIT %(limit)s"""
# The same, of some partitions only (a writer-lease holder's assignments).
SQL_WAL_ROWS_OF = """
SELECT b.topic_id, b.partition, b.base_offset, b.last_offset, b.object_key, b.byte_start,
       b.byte_end, coalesce(w.decided_at <= now() - %(min_age)s * interval '1 second', true)
  FROM unnest(%(topics)s::uuid[], %(partitions)s::int[]) AS a(topic_id, partition)
  JOIN batch_index AS b ON b.topic_id = a.topic_id AND b.partition = a.partition
  LEFT JOIN wal_objects AS w ON w.key = b.object_key""" + _EXPIRING + """
 WHERE b.object_key LIKE 'wal/%%'""" + _NOT_EXPIRING + _AFTER + """
 ORDER BY b.topic_id, b.partition, b.base_offset
 LIMIT %(limit)s"""
SQL_BEGIN = """
SELECT mink_begin_stream_object(%s::bigint, %s::int, %s::bigint, %s::text, %s::uuid, %s::int,
                                %s::bigint, %s::bigint)"""
SQL_SWAP = """
SELECT mink_swap_stream_object_rows(%s::bigint, %s::int, %s::bigint, %s::text, %s::uuid,
                                    %s::int, %s::bigint, %s::bigint, %s::bigint, %s::bigint[],
                                    %s::bigint[], %s::text[], %s::bigint[], %s::bigint[])"""
SQL_SWEEP = "SELECT mink_sweep_stream_uploads(%s::bigint, %s::float8)"
SQL_BACKLOG = """
SELECT count(*), coalesce(sum(byte_end - byte_start), 0) FROM batch_index
 WHERE object_key LIKE 'wal/%'"""
SQL_UPLOADS = "SELECT key FROM stream_object_uploads ORDER BY key"
# A job that ends without its swap forgets its own upload at once instead of leaving it to
# the sweep (tiering_upload_timeout_ms later): the row goes, the object is queued unless an
# index row uses it (a swap that did commit). A swap still running in PostgreSQL holds the
# row's lock, so this waits for it and then finds nothing. Needs no fence: an upload given
# up is never swapped (its swap finds no row: unknown_upload).
SQL_ABANDON = """
WITH gone AS (DELETE FROM stream_object_uploads WHERE key = %s RETURNING key)
INSERT INTO objects_to_delete (key, reason)
SELECT g.key, 'tiering_abandoned' FROM gone AS g
 WHERE NOT EXISTS (SELECT 1 FROM batch_index AS b WHERE b.object_key = g.key)
ON CONFLICT (key) DO NOTHING
RETURNING key"""
# How long a job's end waits for that (shielded, also when the node shuts down).
ABANDON_TIMEOUT_S = 2.0

_json = msgspec.json.Encoder()


@dataclass(frozen=True, slots=True)
class WalRow:
    base_offset: int
    last_offset: int
    object_key: str
    byte_start: int
    byte_end: int

    @property
    def size(self) -> int:
        return self.byte_end - self.byte_start


@dataclass(slots=True)
class StreamObjectPlan:
    """The consecutive WAL rows of one partition that become one stream object."""

    topic_id: uuid.UUID
    partition: int
    rows: list[WalRow] = field(default_factory=list)
    due: bool = False

    @property
    def size(self) -> int:
        return sum(r.size for r in self.rows)

    @property
    def base_offset(self) -> int:
        return self.rows[0].base_offset

    @property
    def last_offset(self) -> int:
        return self.rows[-1].last_offset


class StreamObjectPlanner:
    """Groups WAL rows (topic, partition, base, last, key, start, end, due) in offset order
    into stream objects of at most `target_bytes` (a larger row alone), fed page by page.
    A group is tiered when it is full (the next row did not fit) or holds a row whose WAL
    object is due (older than the delay's share); the last, young, small group of a
    partition waits."""

    def __init__(self, target_bytes: int) -> None:
        self.target_bytes = target_bytes
        self.plans: list[StreamObjectPlan] = []
        self._current: StreamObjectPlan | None = None
        self._current_bytes = 0  # _current.size, kept as rows are added (summing: quadratic)

    def add(self, rows) -> None:
        current, current_bytes = self._current, self._current_bytes
        for topic_id, partition, base, last, key, start, end, due in rows:
            row = WalRow(base, last, key, start, end)
            same_partition = (current is not None and current.topic_id == topic_id
                              and current.partition == partition)
            if (same_partition and current.rows[-1].last_offset + 1 == base
                    and current_bytes + row.size <= self.target_bytes):
                current.rows.append(row)
                current.due = current.due or due
                current_bytes += row.size
                continue
            if current is not None:
                # full, or cut by a gap (retention moved on meanwhile): tiered if it holds
                # anything
                if same_partition or current.due:
                    self.plans.append(current)
            current = StreamObjectPlan(topic_id, partition, [row], due)
            current_bytes = row.size
        self._current, self._current_bytes = current, current_bytes

    def finish(self) -> list[StreamObjectPlan]:
        current = self._current
        if current is not None and (current.due or self._current_bytes >= self.target_bytes):
            self.plans.append(current)
        self._current = None
        return self.plans


def plan_stream_objects(rows: list[tuple], target_bytes: int) -> list[StreamObjectPlan]:
    """The stream objects of `rows` (StreamObjectPlanner), all at once."""
    planner = StreamObjectPlanner(target_bytes)
    planner.add(rows)
    return planner.finish()


async def wal_row_pages(metadata: MetadataStore, min_age_s: float, limit: int = PLAN_ROWS,
                        partitions: list[tuple[uuid.UUID, int]] | None = None,
                        kept_ms: dict[uuid.UUID, int] | None = None):
    """The rows still in WAL objects (of `partitions` only, if given), in plan order, up to
    `limit`, in pages of PAGE_ROWS; of the topics in `kept_ms`, only rows retention keeps
    for at least that long still. One query per page, each after the last row of the one
    before: decoding and planning a round's rows (tens of thousands) in one step held the
    event loop, and every commit of the node behind it, for up to 100 ms. Pages are not one
    snapshot; the swap checks the exact rows it replaces, so a plan that straddles a change
    is refused (index_changed) and planned again next round."""
    kept = kept_ms or {}
    params: dict = {"min_age": min_age_s, "kept_topics": list(kept),
                    "kept_ms": list(kept.values())}
    sql = SQL_WAL_ROWS
    if partitions is not None:
        sql = SQL_WAL_ROWS_OF
        params["topics"] = [t for t, _ in partitions]
        params["partitions"] = [p for _, p in partitions]
    after: tuple = (_FIRST_TOPIC, -1, -1)
    left = limit
    while left > 0:
        size = min(PAGE_ROWS, left)
        page = await metadata.fetch_all(READ, sql, {
            **params, "limit": size, "after_topic": after[0], "after_partition": after[1],
            "after_offset": after[2]})
        if page:
            yield page
        if len(page) < size:
            return
        left -= len(page)
        after = tuple(page[-1][:3])


async def wal_rows(metadata: MetadataStore, min_age_s: float, limit: int = PLAN_ROWS,
                   partitions: list[tuple[uuid.UUID, int]] | None = None,
                   kept_ms: dict[uuid.UUID, int] | None = None) -> list[tuple]:
    """wal_row_pages' rows in one list."""
    return [tuple(r) async for page in wal_row_pages(metadata, min_age_s, limit, partitions,
                                                      kept_ms) for r in page]


async def plan_round(metadata: MetadataStore, min_age_s: float, target_bytes: int, *,
                     partitions: list[tuple[uuid.UUID, int]] | None = None,
                     kept_ms: dict[uuid.UUID, int] | None = None,
                     limit: int = PLAN_ROWS) -> list[StreamObjectPlan]:
    """A round's stream objects, planned page by page (wal_row_pages), a checkpoint after
    each page's planning."""
    planner = StreamObjectPlanner(target_bytes)
    async for page in wal_row_pages(metadata, min_age_s, limit, partitions, kept_ms):
        planner.add(page)
        await trio.lowlevel.checkpoint()
    return planner.finish()


async def backlog(metadata: MetadataStore) -> tuple[int, int]:
    """(index rows, bytes) still pointing into WAL objects."""
    row = await metadata.fetch_one(READ, SQL_BACKLOG)
    assert row is not None
    return row[0], row[1]


async def open_uploads(metadata: MetadataStore) -> list[str]:
    return [r[0] for r in await metadata.fetch_all(READ, SQL_UPLOADS)]


class TieringRefused(Exception):
    """The swap refused the stream object (the reason); the index did not change."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class Pace:
    """At most `bytes_per_s` read, for every job that shares it: a round's reads (and so
    its assembly and its swaps) spread over its interval, not a burst. A burst of a
    round's work, the node and PostgreSQL busy for a few hundred ms on the cores the
    leader's commits use, is what a commit's p99 sees; the same work spread thin is
    interruptions of a few ms. Kafka's remote.log.manager.copy.max.bytes.per.second is
    the same idea with a fixed rate."""

    def __init__(self, bytes_per_s: float) -> None:
        if bytes_per_s <= 0:
            raise ValueError(f"a pace must be positive, not {bytes_per_s}")
        self.bytes_per_s = bytes_per_s
        self._free_at = -math.inf

    async def take(self, nbytes: int) -> None:
        """Wait until `nbytes` more may be read (the first read goes at once)."""
        await trio.sleep_until(self.book(nbytes, trio.current_time()))

    def book(self, nbytes: int, now: float) -> float:
        """Books `nbytes`; returns when they may be read (`now` and the answer on one clock,
        the same at every call: the tiering child's is time.monotonic)."""
        start = max(now, self._free_at)
        self._free_at = start + nbytes / self.bytes_per_s
        return start


def round_pace(plans: list[StreamObjectPlan], interval_s: float,
               spread: float) -> Pace | None:
    """The pace that spreads a round's reads over `spread` of the round interval; None
    (as fast as they go) when spread is 0."""
    total = sum(p.size for p in plans)
    if spread <= 0 or total == 0:
        return None
    return Pace(total / (interval_s * spread))


async def _read_rows(objects, rows: list[WalRow], pace: Pace | None = None) -> list[bytes]:
    """The rows' bytes, a ranged GET per row, READ_CONCURRENCY at once. The first failure
    is raised as itself (not in an exception group, so the job's handlers see the store's
    error) and cancels the rest."""
    out: list[bytes] = [b""] * len(rows)
    pending = iter(range(len(rows)))
    failed: list[Exception] = []

    async def reader(reads: trio.CancelScope) -> None:
        try:
            for i in pending:  # shared by the readers: each row is read once
                row = rows[i]
                if pace is not None:
                    await pace.take(row.size)
                data = await objects.get(row.object_key, row.byte_start, row.byte_end)
                if len(data) != row.size:
                    raise TieringRefused(f"{row.object_key} gave {len(data)} bytes for "
                                         f"[{row.byte_start}, {row.byte_end})")
                out[i] = data
        except Exception as exc:  # noqa: BLE001 - raised below, the first one only
            failed.append(exc)
            reads.cancel()

    async with trio.open_nursery() as nursery:
        for _ in range(min(READ_CONCURRENCY, len(rows))):
            nursery.start_soon(reader, nursery.cancel_scope)
    if failed:
        raise failed[0]
    return out


def walk_rows(writer: StreamObjectWriter, rows: list[WalRow], read_into) -> None:
    """Adds the rows to `writer` as ranges of their WAL objects, reading only enough of
    them to walk their batch headers (`read_into`: a store's `scan` reader). Runs in a
    worker thread; each read lets the event loop have the GIL."""
    window = memoryview(bytearray(WALK_WINDOW))
    for row in rows:
        batches = []
        position = row.byte_start  # of the window's first byte in the WAL object
        while position < row.byte_end:
            want = min(WALK_WINDOW, row.byte_end - position)
            got = read_into(row.object_key, position, window[:want])
            if got < want:
                raise TieringRefused(f"{row.object_key} ends at {position + got}, before "
                                     f"[{row.byte_start}, {row.byte_end}) does")
            if got < RECORD_BATCH_OVERHEAD:
                raise StreamObjectError(f"{got} trailing bytes of {row.object_key} "
                                        f"[{row.byte_start}, {row.byte_end}) are no batch")
            at = 0  # the next batch, from the window's start (it may lie past the window)
            while at + RECORD_BATCH_OVERHEAD <= got:
                header = read_batch_header(window, at)
                size = header.batch_length + LOG_OVERHEAD
                if size < RECORD_BATCH_OVERHEAD:
                    raise StreamObjectError(f"batch at offset {header.base_offset} is "
                                            f"truncated")
                batches.append((header, position + at - row.byte_start))
                at += size
            position += at
        if position != row.byte_end:
            raise StreamObjectError(f"the last batch of {row.object_key} "
                                    f"[{row.byte_start}, {row.byte_end}) runs past it")
        writer.add_batches(batches, ObjectRange(row.object_key, row.byte_start, row.byte_end),
                           row.size)


@dataclass(frozen=True, slots=True)
class WriterFence:
    """The topic's writer lease a handed-over round runs under: its holder and epoch."""

    node_id: int
    epoch: int


async def write_stream_object(metadata: MetadataStore, objects, coordinator_epoch: int,
                              plan: StreamObjectPlan, *, writer: WriterFence | None = None,
                              index_interval: int = DEFAULT_INDEX_INTERVAL,
                              pace: Pace | None = None,
                              children: tiering_child.TieringChildren | None = None) -> str:
    """One job: begin, read, upload, swap. Returns the new object's key once swapped;
    raises TieringRefused (the swap's reason), StaleEpoch (a lease moved: its reason says
    which, 'stale_coordinator_epoch', 'stale_writer_lease_epoch' or 'writer_lease_held';
    the current holder tiers the range again), or the stores' errors. Whatever ends a job
    short of its swap, cancellation included, gives its upload up at once (SQL_ABANDON);
    the sweep is left the uploads of nodes that died. `writer`: the writer lease this
    round holds; None for a coordinator's round of a topic whose writer lease nobody
    holds. `pace`: the round's read rate, shared by its jobs (None: as fast as it goes).
    `children`: on file://, the walk and the copy are done in one of them
    (`tiering_child.py`), not in the node's threads."""
    writer_node = None if writer is None else writer.node_id
    writer_epoch = None if writer is None else writer.epoch
    key = stream_object_key(plan.topic_id, plan.partition, plan.base_offset,
                            plan.last_offset, f"{coordinator_epoch}-{secrets.token_hex(4)}")
    try:
        return await _write_and_swap(metadata, objects, coordinator_epoch, plan, key,
                                     writer_node, writer_epoch, index_interval, pace,
                                     children)
    except BaseException:  # refused, failed or cancelled: this upload will never be swapped
        with trio.CancelScope(shield=True), trio.move_on_after(ABANDON_TIMEOUT_S):
            try:
                await metadata.fetch_all(IDEMPOTENT, SQL_ABANDON, (key,))
            except Exception as exc:  # noqa: BLE001 - the sweep gets it later
                log.info("stream object upload %s left to the sweep: %r", key, exc)
        raise


def swap_arguments(coordinator_epoch: int, writer_node: int | None,
                   writer_epoch: int | None, key: str, plan: StreamObjectPlan,
                   data_length: int) -> tuple:
    """SQL_SWAP's arguments: the stream object `key` of `data_length` bytes replaces the
    plan's rows, given as one array per column."""
    rows = plan.rows
    return (coordinator_epoch, writer_node, writer_epoch, key, plan.topic_id, plan.partition,
            plan.base_offset, plan.last_offset, data_length,
            _int_array([r.base_offset for r in rows]), _int_array([r.last_offset for r in rows]),
            _text_array([r.object_key for r in rows]), _int_array([r.byte_start for r in rows]),
            _int_array([r.byte_end for r in rows]))


# PostgreSQL array literals, built here: psycopg adapts a list a value at a time in Python
# (20 ms on the event loop for a swap's 8,000 rows of five columns; these take 2).
def _int_array(values: list[int]) -> str:
    return "{" + _json.encode(values).decode()[1:-1] + "}"


def _text_array(values: list[str]) -> str:
    joined = '","'.join(values)
    if "\\" in joined or joined.count('"') != 2 * (len(values) - 1):
        joined = '","'.join(v.replace("\\", "\\\\").replace('"', '\\"') for v in values)
    return '{"' + joined + '"}' if values else "{}"


async def _write_and_swap(metadata: MetadataStore, objects, coordinator_epoch: int,
                          plan: StreamObjectPlan, key: str, writer_node: int | None,
                          writer_epoch: int | None, index_interval: int,
                          pace: Pace | None = None,
                          children: tiering_child.TieringChildren | None = None) -> str:
    await metadata.fetch_one(IDEMPOTENT, SQL_BEGIN, (
        coordinator_epoch, writer_node, writer_epoch, key, plan.topic_id, plan.partition,
        plan.base_offset, plan.last_offset))
    if (children is not None and not children.broken
            and getattr(objects, "compose_blocking", None) is not None):
        data_length = await _compose_in_child(children, objects, plan, key, index_interval,
                                              pace)
    else:
        data_length = await _compose_here(objects, plan, key, index_interval, pace)
    row = await metadata.fetch_one(IDEMPOTENT, SQL_SWAP, swap_arguments(
        coordinator_epoch, writer_node, writer_epoch, key, plan, data_length))
    assert row is not None
    if row[0] != "swapped":
        raise TieringRefused(row[0])
    return key


async def _compose_in_child(children: tiering_child.TieringChildren, objects,
                            plan: StreamObjectPlan, key: str, index_interval: int,
                            pace: Pace | None) -> int:
    """_compose_here's work in a tiering child process; the object's data length."""
    job = tiering_child.Job(
        objects.root, objects.fsync, objects.direct, key, str(plan.topic_id),
        plan.partition, index_interval, 0.0 if pace is None else pace.bytes_per_s,
        [(r.object_key, r.byte_start, r.byte_end, r.base_offset, r.last_offset)
         for r in plan.rows])
    try:
        outcome = await children.run(job, getattr(objects, "observe", None))
    except tiering_child.Refused as exc:
        raise TieringRefused(str(exc)) from None
    _check_offsets(plan, outcome.base_offset, outcome.last_offset)
    return outcome.data_length


def _check_offsets(plan: StreamObjectPlan, base_offset: int | None,
                   last_offset: int | None) -> None:
    if (base_offset, last_offset) != (plan.base_offset, plan.last_offset):
        raise TieringRefused(f"the WAL ranges hold offsets [{base_offset}, {last_offset}], "
                             f"the index [{plan.base_offset}, {plan.last_offset}]")


async def _compose_here(objects, plan: StreamObjectPlan, key: str, index_interval: int,
                        pace: Pace | None) -> int:
    """The stream object written from the plan's WAL ranges, in this process; its data
    length."""
    writer = StreamObjectWriter(plan.topic_id, plan.partition, index_interval=index_interval)
    scan, compose = getattr(objects, "scan", None), getattr(objects, "compose", None)
    if scan is not None and compose is not None:
        await scan(lambda read_into: walk_rows(writer, plan.rows, read_into))
        if pace is not None:  # the copy paced a step at a time, not in one burst
            compose = functools.partial(compose, pace=pace.take)
    else:
        compose, step = objects.create, 0
        for data in await _read_rows(objects, plan.rows, pace):
            writer.add(data)
            step += len(data)
            if step >= ASSEMBLY_STEP_BYTES:
                step = 0
                await trio.lowlevel.checkpoint()
    _check_offsets(plan, writer.base_offset, writer.last_offset)
    await compose(key, writer.finish())
    return writer.data_length


# The coordinator's hand-off of rounds to writer-lease holders (sql/0014_tiering_writers.sql).
SQL_ASSIGN = "SELECT mink_assign_tiering(%s::bigint, %s::jsonb)"
SQL_ASSIGNED = """
SELECT topic_id, partition, writer_epoch, coordinator_epoch, assigned_at
  FROM tiering_assignments WHERE holder = %s ORDER BY topic_id, partition"""
SQL_ASSIGNMENTS_DONE = """
DELETE FROM tiering_assignments AS a
 USING unnest(%(topics)s::uuid[], %(partitions)s::int[], %(at)s::timestamptz[])
       AS d(topic_id, partition, assigned_at)
 WHERE a.topic_id = d.topic_id AND a.partition = d.partition AND a.holder = %(node)s
   AND a.assigned_at <= d.assigned_at"""


@dataclass(frozen=True, slots=True)
class Assignment:
    """A partition the coordinator handed to this node, as the holder of its topic's writer
    lease at `writer_epoch`, under `coordinator_epoch`."""

    topic_id: uuid.UUID
    partition: int
    writer_epoch: int
    coordinator_epoch: int
    assigned_at: object


async def assign(metadata: MetadataStore, coordinator_epoch: int,
                 assignments: list[tuple[uuid.UUID, int, int, int]]) -> int:
    """(topic, partition, holder, writer epoch) handed over under the coordinator epoch;
    assignments of holders that lost their writer lease are dropped."""
    rows = [{"topic_id": str(t), "partition": p, "holder": h, "writer_epoch": e}
            for t, p, h, e in assignments]
    row = await metadata.fetch_one(IDEMPOTENT, SQL_ASSIGN,
                                   (coordinator_epoch, _json.encode(rows).decode()))
    assert row is not None
    return row[0]


async def assigned_to(metadata: MetadataStore, node_id: int) -> list[Assignment]:
    return [Assignment(*r) for r in await metadata.fetch_all(READ, SQL_ASSIGNED, (node_id,))]


async def assignments_done(metadata: MetadataStore, node_id: int,
                           done: list[Assignment]) -> None:
    """Forget the assignments a round did (unless the coordinator renewed them since)."""
    if done:
        await metadata.fetch_all(IDEMPOTENT, SQL_ASSIGNMENTS_DONE + " RETURNING a.partition", {
            "topics": [a.topic_id for a in done], "partitions": [a.partition for a in done],
            "at": [a.assigned_at for a in done], "node": node_id})


async def sweep_uploads(metadata: MetadataStore, coordinator_epoch: int,
                        age_s: float) -> list[str]:
    """Uploads begun more than age_s ago and never swapped: queued for deletion."""
    return [r[0] for r in await metadata.fetch_all(IDEMPOTENT, SQL_SWEEP,
                                                   (coordinator_epoch, age_s))]


__all__ = [
    "Assignment", "Pace", "StreamObjectPlan", "StreamObjectPlanner", "TieringRefused", "WalRow",
    "WriterFence", "assign", "assigned_to", "assignments_done", "backlog", "open_uploads",
    "plan_round", "plan_stream_objects", "round_pace", "sweep_uploads", "wal_row_pages", "wal_rows",
    "write_stream_object",
]
