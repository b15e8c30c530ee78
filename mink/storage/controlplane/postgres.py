"""The control plane on PostgreSQL: `MetadataStore`, Mink's metadata operations.

A narrow interface of epoch-checked operations (in the spirit of Inkless' control plane).
Every operation is ONE statement or ONE transaction that checks the epochs it carries; the
write operations are SQL functions defined in `sql/0002_operations.sql`, so each one
is a single round trip and its SQL reads top to bottom there. Schema: `sql/0001_schema.sql`.

Runtime: every public method is a trio-native `async def` running one statement on a
connection of `pool.ConnectionPool`, psycopg async connections whose waits are trio's own
(no crossing into asyncio per statement). New connections are opened through asyncio (psycopg
resolves host names there), and LISTEN runs there: the store must be opened and used inside
a `trio_asyncio.open_loop()`.

Errors: `MetadataError` and subclasses. `MetadataUnavailable` is retriable: PostgreSQL cannot
be reached (no pooled connection within `timeout` seconds, a lost connection, an operation
over `op_timeout`). Nothing was written when it is raised, except for its subclass
`OutcomeUnknown`: a write operation lost its connection (or timed out) after the statement
was sent, so it may or may not have been committed. For `commit_wal`, read the outcome back
with `commit_outcome(keys)` (which also settles it) or call `commit_wal` again with the same
objects: it is keyed by object key.

Connection loss handling: a pooled connection whose socket shows end-of-file (PostgreSQL
restarted or stopped) is discarded before any statement is sent on it, reads and idempotent
operations are retried once on a fresh connection after a connection loss, and the pool is
checked; no restart of the store is needed when PostgreSQL comes back.
"""

from __future__ import annotations

import asyncio
import base64
import enum
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Sequence
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import trio
import trio_asyncio  # before psycopg.waiting where we can: see _bind_running_loop below
import psycopg
import psycopg.waiting

from mink.storage.controlplane.api import (
    Change,
    CommitOutcome,
    IndexRow,
    InvalidPartitions,
    LeaderMoved,
    LeaseInfo,
    MetadataError,
    MetadataRejected,
    MetadataUnavailable,
    NodeAlive,
    NodeIdInUse,
    NodeInfo,
    OutcomeUnknown,
    ProducerState,
    ProducerStateUpdate,
    RangeOutcome,
    StaleEpoch,
    StreamState,
    TopicExists,
    TopicRecord,
    UnknownNode,
    UnknownTopic,
    View,
    ViewDelta,
    WalObject,
)
from mink.storage.controlplane.listener import Listener
from mink.storage.controlplane.migrate import migrate as _migrate
from mink.storage.controlplane.pool import (
    ConnectionPool,
    PoolClosed,
    PoolTimeout,
    TrioConnection,
    looks_dead,
)
from mink.storage.pgtext import dict_from_pg, dict_to_pg


logger = logging.getLogger(__name__)


def _bind_running_loop() -> None:
    """psycopg.waiting binds `asyncio.get_running_loop` by name when it is first imported.
    Imported before trio_asyncio (a test file or another library importing psycopg first),
    it keeps the unpatched function, which sees no loop inside trio_asyncio, and every
    connection attempt fails with "no running event loop". Rebind it to the patched one."""
    import asyncio

    if psycopg.waiting.get_running_loop is not asyncio.get_running_loop:
        psycopg.waiting.get_running_loop = asyncio.get_running_loop


_bind_running_loop()

NOTIFY_CHANNEL = "mink_view"
COORDINATOR_LEASE = "coordinator"


class _StoredOutcome(msgspec.Struct):
    committed: bool
    reason: str | None
    ranges: list[RangeOutcome]


_json_encoder = msgspec.json.Encoder()
_outcome_decoder = msgspec.json.Decoder(_StoredOutcome)
_view_decoder = msgspec.json.Decoder(View)
_view_delta_decoder = msgspec.json.Decoder(ViewDelta)


def _topic_info(row) -> TopicRecord:
    """A topics row; its config holds client strings in pgtext's encoding."""
    topic_id, name, partitions, config, created_at = row
    return TopicRecord(topic_id, name, partitions, dict_from_pg(config), created_at)


def _with_configs(view):
    """A View or ViewDelta with topic configs stored escaped (pgtext) decoded."""
    if any(_config_escaped(t.config) for t in view.topics):
        view = msgspec.structs.replace(view, topics=[
            msgspec.structs.replace(t, config=dict_from_pg(t.config)) for t in view.topics])
    return view


def _config_escaped(config: dict) -> bool:
    return dict_from_pg(config) is not config



# ---------------------------------------------------------------------------------------------
# SQL

SQL_REGISTER_NODE = "SELECT mink_register_node(%s::int, %s::text, %s::int, %s::text, %s::float8)"
SQL_REGISTER_INCARNATION = """
SELECT mink_register_incarnation(%s::int, %s::text, %s::int, %s::text, %s::float8, %s::uuid,
                                 %s::float8)"""
SQL_HEARTBEAT = """
UPDATE nodes SET expires_at = now() + %s::float8 * interval '1 second', renewed_at = now()
 WHERE node_id = %s AND epoch = %s AND expires_at <> '-infinity'
RETURNING epoch"""
SQL_LEAVE = "SELECT mink_leave_node(%s::int, %s::bigint)"
SQL_FENCE_NODE = "SELECT mink_fence_node(%s::int, %s::bigint)"
SQL_DRAIN_NODE = "SELECT mink_drain_node(%s::int, %s::bigint, %s::text)"
SQL_UNDRAIN_NODE = "SELECT mink_undrain_node(%s::int)"
# A drain's progress: partitions still led by the node, and partitions that were its own and
# are not open yet by their new leader at their current leader epoch.
SQL_NOT_HANDED_OVER = """
SELECT count(*) FROM partitions AS p JOIN topics AS t USING (topic_id)
 WHERE t.deleted_at IS NULL
   AND (p.leader_node = %(node)s
        OR ((p.topic_id, p.partition) IN (SELECT * FROM unnest(%(topics)s::uuid[],
                                                               %(partitions)s::int[]))
            AND NOT (p.stream_state = 'open' AND p.opened_by_node = p.leader_node
                     AND p.open_leader_epoch = p.leader_epoch)))"""
_NODE_COLUMNS = """node_id, epoch, host, port, rack,
       CASE WHEN expires_at = '-infinity' THEN NULL ELSE expires_at END, expires_at > now()"""
SQL_LIVE_NODES = f"SELECT {_NODE_COLUMNS} FROM nodes WHERE expires_at > now() ORDER BY node_id"
SQL_ALL_NODES = f"SELECT {_NODE_COLUMNS} FROM nodes ORDER BY node_id"

SQL_ACQUIRE_LEASE = "SELECT mink_acquire_lease(%s::text, %s::int, %s::bigint, %s::float8)"
SQL_ACQUIRE_LEASES = """
SELECT s.scope, mink_acquire_lease(s.scope, %s::int, %s::bigint, %s::float8)
  FROM unnest(%s::text[]) AS s(scope)"""
SQL_RENEW_LEASE = """
UPDATE leases SET expires_at = now() + %s::float8 * interval '1 second'
 WHERE scope = %s AND holder = %s AND epoch = %s AND expires_at > now()
RETURNING epoch"""
# Several leases this node holds, in one statement (none renewed unless the node is live at
# its epoch); rows locked in scope order.
SQL_RENEW_LEASES = """
WITH held AS (
    SELECT l.scope FROM leases AS l
      JOIN unnest(%(scopes)s::text[], %(epochs)s::bigint[]) AS h(scope, epoch)
        ON l.scope = h.scope AND l.epoch = h.epoch
     WHERE l.holder = %(node)s AND l.expires_at > now()
       AND EXISTS (SELECT 1 FROM nodes WHERE node_id = %(node)s AND epoch = %(node_epoch)s
                                         AND expires_at > now())
     ORDER BY l.scope
       FOR UPDATE OF l)
UPDATE leases AS l SET expires_at = now() + %(ttl)s::float8 * interval '1 second'
  FROM held WHERE l.scope = held.scope
RETURNING l.scope, l.epoch"""
SQL_RELEASE_LEASE = """
UPDATE leases SET expires_at = '-infinity'
 WHERE scope = %s AND holder = %s AND epoch = %s AND expires_at > now()
RETURNING epoch"""
SQL_LEASES = """
SELECT scope, holder, holder_epoch, epoch,
       CASE WHEN expires_at = '-infinity' THEN NULL ELSE expires_at END, expires_at > now()
  FROM leases WHERE scope LIKE %s ORDER BY scope"""

_TOPIC_COLUMNS = "topic_id, name, partitions, config, created_at"
SQL_CREATE_TOPIC = f"""
SELECT {_TOPIC_COLUMNS}
  FROM mink_create_topic(%s::text, %s::int, %s::jsonb, %s::int[], %s::uuid, %s::bigint)"""
SQL_DELETE_TOPIC = "SELECT topic_id FROM mink_delete_topic(%s::text, %s::uuid, %s::bigint)"
SQL_CREATE_PARTITIONS = f"""
SELECT {_TOPIC_COLUMNS} FROM mink_create_partitions(%s::text, %s::int, %s::int[], %s::bigint)"""
SQL_GET_TOPICS = f"SELECT {_TOPIC_COLUMNS} FROM topics WHERE deleted_at IS NULL ORDER BY name"
SQL_GET_TOPIC = f"SELECT {_TOPIC_COLUMNS} FROM topics WHERE deleted_at IS NULL AND name = %s"

# The view's parts as JSON: the live nodes (with their listeners) and the coordinator lease's
# holder; a topic row `t` with its partitions.
_NODES_JSON = """
    'coordinator', (SELECT l.holder FROM leases AS l
                     WHERE l.scope = 'coordinator' AND l.expires_at > now()),
    'nodes', coalesce((
        SELECT json_agg(json_build_object(
                   'node_id', n.node_id, 'epoch', n.epoch, 'host', n.host, 'port', n.port,
                   'rack', n.rack, 'expires_at', n.expires_at, 'draining', n.draining,
                   'endpoints', coalesce((
                       SELECT json_agg(json_build_array(e.listener_name, e.security_protocol,
                                                        e.host, e.port)
                                       ORDER BY e.listener_name)
                         FROM node_endpoints AS e WHERE e.node_id = n.node_id), '[]'))
                   ORDER BY n.node_id)
          FROM nodes AS n WHERE n.expires_at > now()), '[]')"""
_TOPIC_JSON = """json_build_object(
                   'topic_id', t.topic_id, 'name', t.name, 'config', t.config,
                   'partitions', coalesce((
                       SELECT json_agg(json_build_array(
                                  p.partition, p.leader_node, p.leader_epoch, p.stream_state,
                                  p.opened_by_node, p.opened_by_epoch, p.open_leader_epoch)
                                  ORDER BY p.partition)
                         FROM partitions AS p WHERE p.topic_id = t.topic_id), '[]'))"""
# The whole view in one statement (one snapshot), as JSON decoded straight into View.
SQL_VIEW = f"""
SELECT json_build_object(
    'version', c.view_version,
    'cluster_id', c.cluster_id,{_NODES_JSON},
    'topics', coalesce((
        SELECT json_agg({_TOPIC_JSON} ORDER BY t.name)
          FROM topics AS t WHERE t.deleted_at IS NULL), '[]')
)::text
  FROM cluster AS c"""
# What changed since a version (one statement, one snapshot), decoded into ViewDelta: the
# nodes and the coordinator always; the topics the change log names after the version, or
# every topic when it no longer holds every row after it (pruned) or no version is held (-1).
# Versions have no gaps, so the log is whole after `since` when it has view_version - since
# rows there.
SQL_VIEW_SINCE = f"""
WITH log AS (SELECT body FROM change_log WHERE version > %(since)s),
     c AS (SELECT view_version, cluster_id,
                  %(since)s >= 0 AND (SELECT count(*) FROM log) = view_version - %(since)s
                      AS complete
             FROM cluster),
     changed AS (SELECT (body->>'topic_id')::uuid AS topic_id FROM log
                  WHERE body ? 'topic_id'
                 UNION  -- a batch of moves names its topics in one row
                 SELECT t::uuid FROM log, jsonb_array_elements_text(body->'topic_ids') AS t
                  WHERE body ? 'topic_ids')
SELECT json_build_object(
    'version', c.view_version,
    'cluster_id', c.cluster_id,
    'complete', c.complete,{_NODES_JSON},
    'changed', CASE WHEN c.complete
                    THEN coalesce((SELECT json_agg(topic_id) FROM changed), '[]') END,
    'topics', coalesce((
        SELECT json_agg({_TOPIC_JSON} ORDER BY t.name)
          FROM topics AS t
         WHERE t.deleted_at IS NULL
           AND (NOT c.complete OR t.topic_id IN (SELECT topic_id FROM changed))), '[]')
)::text
  FROM c"""

SQL_LEAD_PARTITION = "SELECT mink_lead_partition(%s::uuid, %s::int, %s::int, %s::bigint, %s::int)"
SQL_RELEAD_OWN_PARTITION = """
SELECT mink_relead_own_partition(%s::uuid, %s::int, %s::int, %s::bigint, %s::int)"""
SQL_LEAD_PARTITIONS = """
SELECT o_leader_epoch
  FROM mink_lead_partitions(%s::bigint, %s::uuid[], %s::int[], %s::int[], %s::int[])
 ORDER BY o_n"""

_STREAM_COLUMNS = """topic_id, partition, leader_node, leader_epoch, stream_state, opened_by_node,
       opened_by_epoch, open_leader_epoch, log_start_offset, committed_end, max_timestamp"""
SQL_OPEN_STREAM = f"""
SELECT {_STREAM_COLUMNS} FROM mink_open_stream(%s::uuid, %s::int, %s::int, %s::int, %s::bigint)"""
SQL_OPEN_STREAM_WITH_PRODUCERS = "SELECT " + ", ".join(
    f"(stream).{c.strip()}" for c in _STREAM_COLUMNS.split(",")) + """, producers::text
  FROM mink_open_stream_with_producers(%s::uuid, %s::int, %s::int, %s::int, %s::bigint)"""
SQL_OPEN_STREAMS = "SELECT o_topic_id, o_partition, o_refusal, o_message, o_detail, " + \
    ", ".join(f"(o_stream).{c.strip()}" for c in _STREAM_COLUMNS.split(",")) + """,
       o_producers::text
  FROM mink_open_streams(%s::uuid[], %s::int[], %s::int[], %s::bool[], %s::int, %s::bigint)"""
SQL_CLOSE_STREAM = """
UPDATE partitions SET stream_state = 'closed'
 WHERE topic_id = %(topic_id)s AND partition = %(partition)s AND stream_state = 'open'
   AND opened_by_node = %(node)s AND opened_by_epoch = %(node_epoch)s
   AND open_leader_epoch = %(leader_epoch)s
   AND EXISTS (SELECT 1 FROM nodes WHERE node_id = %(node)s AND epoch = %(node_epoch)s)
RETURNING partition"""
# Several at once; the rows locked in (topic_id, partition) order, as CommitWal locks them.
SQL_CLOSE_STREAMS = """
WITH target AS (
    SELECT p.topic_id, p.partition FROM partitions AS p
      JOIN unnest(%(topic_ids)s::uuid[], %(partitions)s::int[], %(epochs)s::int[])
           AS c(topic_id, partition, leader_epoch)
        ON p.topic_id = c.topic_id AND p.partition = c.partition
       AND p.open_leader_epoch = c.leader_epoch
     WHERE p.stream_state = 'open' AND p.opened_by_node = %(node)s
       AND p.opened_by_epoch = %(node_epoch)s
       AND EXISTS (SELECT 1 FROM nodes WHERE node_id = %(node)s AND epoch = %(node_epoch)s)
     ORDER BY p.topic_id, p.partition
       FOR UPDATE OF p)
UPDATE partitions AS p SET stream_state = 'closed'
  FROM target WHERE p.topic_id = target.topic_id AND p.partition = target.partition
RETURNING p.partition"""
SQL_STREAM_STATE = f"""
SELECT {_STREAM_COLUMNS} FROM partitions WHERE topic_id = %s AND partition = %s"""
SQL_STREAM_STATES = f"""
SELECT {_STREAM_COLUMNS} FROM partitions
 WHERE (topic_id, partition) IN (SELECT * FROM unnest(%s::uuid[], %s::int[]))"""

SQL_COMMIT_WAL = """
SELECT object_key, object_outcome::text, repeated
  FROM mink_commit_wal(%s::int, %s::bigint, %s::jsonb)"""
SQL_COMMIT_OUTCOME = """
SELECT object_key, object_outcome::text FROM mink_commit_outcome(%s::text[], %s::bool)"""

_INDEX_COLUMNS = ("base_offset, last_offset, object_key, byte_start, byte_end, max_timestamp,"
                  " batch_count")
SQL_FIND_BATCHES = f"""
SELECT {_INDEX_COLUMNS} FROM batch_index
 WHERE topic_id = %s AND partition = %s AND last_offset >= %s
 ORDER BY last_offset LIMIT %s"""
# running_max_timestamp grows with the offset: the first row reaching ts is found by the index,
# then the first row from there whose own max_timestamp reaches ts (normally that same row).
SQL_OFFSET_FOR_TIMESTAMP = f"""
SELECT {_INDEX_COLUMNS} FROM batch_index
 WHERE topic_id = %(t)s AND partition = %(p)s AND max_timestamp >= %(ts)s
   AND base_offset >= (SELECT base_offset FROM batch_index
                        WHERE topic_id = %(t)s AND partition = %(p)s
                          AND running_max_timestamp >= %(ts)s
                        ORDER BY running_max_timestamp, base_offset LIMIT 1)
 ORDER BY base_offset LIMIT 1"""
SQL_LEADER_EPOCH_END = """
SELECT p.committed_end,
       (SELECT max(e.leader_epoch) FROM leader_epochs AS e
         WHERE e.topic_id = p.topic_id AND e.partition = p.partition),
       (SELECT e.leader_epoch FROM leader_epochs AS e
         WHERE e.topic_id = p.topic_id AND e.partition = p.partition
           AND e.leader_epoch <= %(epoch)s
         ORDER BY e.leader_epoch DESC LIMIT 1),
       (SELECT e.start_offset FROM leader_epochs AS e
         WHERE e.topic_id = p.topic_id AND e.partition = p.partition
           AND e.leader_epoch > %(epoch)s
         ORDER BY e.leader_epoch LIMIT 1)
  FROM partitions AS p WHERE p.topic_id = %(t)s AND p.partition = %(p)s"""
SQL_REQUEST_CLUSTER_ACTION = """
INSERT INTO cluster_requests (kind) VALUES (%s) RETURNING id"""
SQL_PENDING_CLUSTER_REQUESTS = """
SELECT id FROM cluster_requests WHERE kind = %s AND done_at IS NULL ORDER BY id"""
SQL_FINISH_CLUSTER_REQUEST = """
UPDATE cluster_requests SET done_at = now(), result = %s::jsonb
 WHERE id = %s AND done_at IS NULL RETURNING id"""
SQL_CLUSTER_REQUEST_RESULT = """
SELECT result FROM cluster_requests WHERE id = %s"""
SQL_WRITE_TOPIC_STATS = """
INSERT INTO topic_stats AS s (topic_id, partitions, records, bytes, computed_by, lease_epoch)
SELECT p.topic_id, count(*), coalesce(sum(p.committed_end - p.log_start_offset), 0),
       (SELECT coalesce(sum(s.indexed_bytes), 0) FROM partition_stats AS s
         WHERE s.topic_id = %(topic)s), %(node)s, %(epoch)s
  FROM partitions AS p
 WHERE p.topic_id = %(topic)s
   AND EXISTS (SELECT 1 FROM leases AS l
                WHERE l.scope = %(scope)s AND l.holder = %(node)s AND l.epoch = %(epoch)s
                  AND l.expires_at > now())
 GROUP BY p.topic_id
ON CONFLICT (topic_id) DO UPDATE
    SET partitions = excluded.partitions, records = excluded.records, bytes = excluded.bytes,
        computed_by = excluded.computed_by, lease_epoch = excluded.lease_epoch,
        computed_at = now()
RETURNING s.topic_id"""
# The statistics of every topic whose writer lease this node holds (at the epochs given), in
# one statement; a row is written only when a figure changed, so an idle cluster writes none.
SQL_WRITE_TOPICS_STATS = """
INSERT INTO topic_stats AS s (topic_id, partitions, records, bytes, computed_by, lease_epoch)
SELECT h.topic_id, count(*), coalesce(sum(p.committed_end - p.log_start_offset), 0),
       (SELECT coalesce(sum(x.indexed_bytes), 0) FROM partition_stats AS x
         WHERE x.topic_id = h.topic_id), %(node)s, h.epoch
  FROM unnest(%(topics)s::uuid[], %(epochs)s::bigint[]) AS h(topic_id, epoch)
  JOIN partitions AS p ON p.topic_id = h.topic_id
 WHERE EXISTS (SELECT 1 FROM leases AS l
                WHERE l.scope = 'writer/' || h.topic_id::text AND l.holder = %(node)s
                  AND l.epoch = h.epoch AND l.expires_at > now())
 GROUP BY h.topic_id, h.epoch
ON CONFLICT (topic_id) DO UPDATE
    SET partitions = excluded.partitions, records = excluded.records, bytes = excluded.bytes,
        computed_by = excluded.computed_by, lease_epoch = excluded.lease_epoch,
        computed_at = now()
    WHERE (s.partitions, s.records, s.bytes, s.computed_by, s.lease_epoch)
          IS DISTINCT FROM (excluded.partitions, excluded.records, excluded.bytes,
                            excluded.computed_by, excluded.lease_epoch)
RETURNING s.topic_id"""
SQL_TOPIC_STATS = """
SELECT topic_id, partitions, records, bytes FROM topic_stats"""
SQL_PRODUCER_ID_ISSUED = """
SELECT %s::bigint BETWEEN 0 AND next_producer_id - 1 FROM cluster"""
SQL_PRODUCER_STATES = """
SELECT producer_id, producer_epoch, state, updated_at FROM producer_state
 WHERE topic_id = %s AND partition = %s ORDER BY producer_id"""

SQL_CHANGES_SINCE = """
SELECT c.view_version, l.version, l.kind, l.body, l.at
  FROM cluster AS c
  LEFT JOIN LATERAL (SELECT * FROM change_log WHERE version > %s
                      ORDER BY version LIMIT %s) AS l ON true
 ORDER BY l.version"""
SQL_CLUSTER_ID = "SELECT cluster_id FROM cluster"
SQL_ALLOCATE_PRODUCER_IDS = """
UPDATE cluster SET next_producer_id = next_producer_id + %(n)s
RETURNING next_producer_id - %(n)s"""

SQL_UNREFERENCED_OBJECTS = """
SELECT w.key FROM wal_objects AS w
 WHERE w.committed AND w.gc_queued_at IS NULL
   AND NOT EXISTS (SELECT 1 FROM batch_index AS b WHERE b.object_key = w.key)
 ORDER BY w.decided_at LIMIT %s"""
SQL_QUEUE_FOR_DELETION = "SELECT mink_queue_for_deletion(%s::text[], %s::text)"
SQL_PENDING_DELETIONS = "SELECT key, reason FROM objects_to_delete ORDER BY queued_at, key LIMIT %s"
SQL_DELETIONS_DONE = "DELETE FROM objects_to_delete WHERE key = ANY (%s::text[])"


# ---------------------------------------------------------------------------------------------
# Error mapping

def _domain_error(e: psycopg.Error) -> MetadataError | None:
    """The refusal a SQL function raised (SQLSTATE MKnnn, see 0002_operations.sql)."""
    state = e.sqlstate
    message = e.diag.message_primary or ""
    if state == "23505" and e.diag.constraint_name in ("topics_live_name", "topics_pkey"):
        return TopicExists(e.diag.message_detail or message)
    return _refusal(state, message, e.diag.message_detail)


def _refusal(state: str | None, message: str, detail: str | None) -> MetadataError | None:
    """The MetadataError of a refusal's SQLSTATE (MKnnn), message and detail."""
    if state == "MK001":
        return StaleEpoch(message)
    if state == "MK002":
        fields = msgspec.json.decode(detail or "{}")
        return LeaderMoved(message, fields.get("leader_node"), fields.get("leader_epoch"))
    if state == "MK003":
        return UnknownTopic(message)
    if state == "MK004":
        return TopicExists(message)
    if state == "MK005":
        return InvalidPartitions(message)
    if state == "MK006":
        return UnknownNode(message)
    if state == "MK007":
        return NodeAlive(message)
    if state == "MK008":
        return NodeIdInUse(message, msgspec.json.decode(detail or "{}"))
    return None


def _connection_lost(e: psycopg.Error, conn: psycopg.AsyncConnection | None) -> bool:
    if conn is not None and (conn.broken or conn.closed):
        return True
    state = e.sqlstate or ""
    if isinstance(e, psycopg.OperationalError) and not state:
        return True
    return state.startswith(("08", "57P"))  # connection exception, operator intervention


# SQLSTATEs meaning "rolled back, nothing happened, try again": serialization failure, deadlock
_ROLLED_BACK = ("40001", "40P01")
# reported by the server, so definitely not applied, but not worth an immediate retry:
# canceled (statement_timeout, an administrator), too many connections, out of resources
_UNAVAILABLE_PREFIXES = ("57014", "53")


class StatementKind(enum.Enum):
    """What a statement may do, which decides its retries (every caller of `fetch_one` /
    `fetch_all` says which)."""

    READ = "read"              # retried after a connection loss; never OutcomeUnknown
    IDEMPOTENT = "idempotent"  # a write safe to repeat: retried once, then OutcomeUnknown
    WRITE = "write"            # not retried after it was sent: OutcomeUnknown


READ, IDEMPOTENT, WRITE = StatementKind.READ, StatementKind.IDEMPOTENT, StatementKind.WRITE

Op = Callable[[psycopg.AsyncConnection], Awaitable[Any]]


# ---------------------------------------------------------------------------------------------
# The store

class MetadataStore:
    """Open with `await MetadataStore.open(conninfo)`; close with `await store.aclose()`."""

    def __init__(self, conninfo: str, *, min_size: int, max_size: int, timeout: float,
                 op_timeout: float, name: str):
        self.conninfo = conninfo
        self.timeout = timeout
        self.op_timeout = op_timeout
        self._min_size = min_size
        self._max_size = max_size
        self._name = name
        self._kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": max(1, round(timeout)),
            "keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
            "keepalives_count": 3,
            "application_name": name,
        }
        self._pool: ConnectionPool | None = None
        # new connections open through asyncio: psycopg resolves host names there (rare)
        self._connect = trio_asyncio.aio_as_trio(self._aio_connect)

    @property
    def pool_size(self) -> int:
        """The most connections the pool opens."""
        return self._max_size

    # -- life cycle ----------------------------------------------------------------------------

    @classmethod
    async def open(cls, conninfo: str, *, min_size: int = 1, max_size: int = 8,
                   timeout: float = 5.0, op_timeout: float = 30.0, migrate: bool = True,
                   name: str = "mink-metadata") -> MetadataStore:
        """Connect (raises MetadataUnavailable after `timeout` s) and apply migrations.

        timeout: the longest wait for a pooled connection; op_timeout: the longest an operation
        runs (including a retry) before it is abandoned."""
        store = cls(conninfo, min_size=min_size, max_size=max_size, timeout=timeout,
                    op_timeout=op_timeout, name=name)
        pool = ConnectionPool(store._connect, min_size=min_size, max_size=max_size,
                              timeout=timeout)
        try:
            conn = await pool.getconn()
        except PoolTimeout as e:
            pool.close()
            raise MetadataUnavailable(f"PostgreSQL not reachable: {e}") from e
        try:
            if migrate:
                await _migrate(conn)
        except psycopg.OperationalError as e:
            pool.putconn(conn)
            pool.close()
            raise MetadataUnavailable(f"PostgreSQL not reachable: {e}") from e
        except BaseException:
            pool.putconn(conn)
            pool.close()
            raise
        pool.putconn(conn)
        store._pool = pool
        return store

    async def _aio_connect(self) -> TrioConnection:
        return await TrioConnection.connect(self.conninfo, **self._kwargs)

    async def aclose(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            pool.close()

    async def __aenter__(self) -> MetadataStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- running operations --------------------------------------------------------------------

    async def _run(self, kind: StatementKind, op: Op) -> Any:
        """Run `op(conn)` on a pooled connection, with the retries `kind` allows, within
        op_timeout."""
        pool = self._pool
        if pool is None:
            raise MetadataError("the metadata store is closed")
        attempt = 0
        sent = False  # a write statement was sent at least once: its outcome may be unknown
        try:
            with trio.fail_after(self.op_timeout):
                while True:
                    attempt += 1
                    conn = None
                    try:
                        conn = await self._checkout(pool)
                        sent = sent or kind is not READ
                        try:
                            return await op(conn)
                        finally:
                            # also when cancelled: a connection left ACTIVE is closed
                            pool.putconn(conn)
                    except (PoolTimeout, PoolClosed):
                        raise
                    except psycopg.Error as e:
                        if (err := _domain_error(e)) is not None:
                            raise err from None
                        if e.sqlstate in _ROLLED_BACK and attempt < 4:
                            continue
                        if e.sqlstate and e.sqlstate.startswith(_UNAVAILABLE_PREFIXES):
                            raise MetadataUnavailable(str(e)) from e
                        if not _connection_lost(e, conn):
                            if e.sqlstate:  # the server answered: rolled back, not applied
                                raise MetadataRejected(f"{e.sqlstate}: {e}") from e
                            raise
                        logger.info("metadata connection lost: %s", e)
                        pool.check()
                        if kind is not WRITE and attempt < 2:
                            continue
                        if sent:
                            raise OutcomeUnknown(f"connection lost: {e}") from e
                        raise MetadataUnavailable(f"connection lost: {e}") from e
        except PoolTimeout as e:
            if sent:
                raise OutcomeUnknown(f"connection lost, then {e}") from e
            raise MetadataUnavailable(f"PostgreSQL not reachable: {e}") from e
        except PoolClosed as e:
            raise MetadataError("the metadata store is closed") from e
        except trio.TooSlowError as e:
            if sent:
                raise OutcomeUnknown(f"no answer within {self.op_timeout} s") from e
            raise MetadataUnavailable(f"no answer within {self.op_timeout} s") from e

    async def _checkout(self, pool: ConnectionPool) -> TrioConnection:
        """A pooled connection that was not closed by the server while it sat in the pool."""
        for _ in range(2):
            conn = await pool.getconn()
            if not looks_dead(conn):
                return conn
            pool.putconn(conn)  # BAD: closed there
            pool.check()  # its idle siblings were most likely closed too
        return await pool.getconn()

    # -- one statement: the primitive of every operation -----------------------------------
    # Public for the control plane's operation modules beside this one (`groups`, and
    # `mink.storage.lifecycle.store`), which keep their own SQL: each operation is one
    # statement (mostly a fenced SQL function), run here with the pool's error mapping,
    # retries (by `kind`) and deadline. Nothing outside this module touches its private parts.

    async def fetch_one(self, kind: StatementKind, sql: str,
                        params: Any = None) -> tuple | None:
        """The first row of one statement (None if it returned none)."""
        async def op(conn: psycopg.AsyncConnection) -> tuple | None:
            cur = await conn.execute(sql, params)
            return await cur.fetchone()
        return await self._run(kind, op)

    async def fetch_all(self, kind: StatementKind, sql: str,
                        params: Any = None) -> list[tuple]:
        """Every row of one statement."""
        async def op(conn: psycopg.AsyncConnection) -> list[tuple]:
            cur = await conn.execute(sql, params)
            return await cur.fetchall()
        return await self._run(kind, op)

    # -- cluster -------------------------------------------------------------------------------

    async def cluster_id(self) -> str:
        row = await self.fetch_one(READ, SQL_CLUSTER_ID)
        assert row is not None
        return row[0]

    async def allocate_producer_ids(self, count: int) -> int:
        """Reserve `count` producer ids; returns the first (ids first .. first+count-1)."""
        row = await self.fetch_one(WRITE, SQL_ALLOCATE_PRODUCER_IDS, {"n": count})
        assert row is not None
        return row[0]

    async def producer_id_issued(self, producer_id: int) -> bool:
        """Whether `producer_id` was ever handed out (ids are never reused)."""
        row = await self.fetch_one(READ, SQL_PRODUCER_ID_ISSUED, (producer_id,))
        return bool(row and row[0])

    # -- operator requests carried out by the coordinator ---------------------------------------

    async def request_cluster_action(self, kind: str) -> int:
        row = await self.fetch_one(WRITE, SQL_REQUEST_CLUSTER_ACTION, (kind,))
        assert row is not None
        return row[0]

    async def pending_cluster_requests(self, kind: str) -> list[int]:
        return [r[0] for r in await self.fetch_all(READ, SQL_PENDING_CLUSTER_REQUESTS, (kind,))]

    async def finish_cluster_request(self, request_id: int, result: dict[str, Any]) -> None:
        await self.fetch_one(IDEMPOTENT, SQL_FINISH_CLUSTER_REQUEST,
                             (_json_encoder.encode(result).decode(), request_id))

    async def cluster_request_result(self, request_id: int) -> dict[str, Any] | None:
        row = await self.fetch_one(READ, SQL_CLUSTER_REQUEST_RESULT, (request_id,))
        return None if row is None or row[0] is None else row[0]

    # -- membership ----------------------------------------------------------------------------

    async def register_node(self, node_id: int, host: str, port: int, rack: str | None = None,
                            *, ttl_s: float = 30.0, incarnation: uuid.UUID | None = None,
                            guard_s: float = 0.0) -> int:
        """RegisterNode: the new node epoch (previous + 1, 1 for a new node id). With an
        incarnation (a node process passes its own): NodeIdInUse if another incarnation
        renewed this node id within guard_s seconds and is live."""
        if incarnation is not None:
            row = await self.fetch_one(WRITE, SQL_REGISTER_INCARNATION, (
                node_id, host, port, rack, ttl_s, incarnation, guard_s))
            assert row is not None
            return row[0]
        row = await self.fetch_one(WRITE, SQL_REGISTER_NODE, (node_id, host, port, rack, ttl_s))
        assert row is not None
        return row[0]

    async def heartbeat(self, node_id: int, node_epoch: int, *, ttl_s: float = 30.0) -> None:
        """Renew membership for ttl_s. StaleEpoch('stale_node_epoch') if the epoch is not the
        node's current one (fenced or re-registered) or the node left: close everything and
        register again. An expired but unfenced node is live again."""
        row = await self.fetch_one(IDEMPOTENT, SQL_HEARTBEAT, (ttl_s, node_id, node_epoch))
        if row is None:
            raise StaleEpoch("stale_node_epoch")

    async def leave(self, node_id: int, node_epoch: int) -> None:
        """Clean stop: not live any more (heartbeats cannot revive it), its leases released;
        the row and its epoch stay, the next register_node gets epoch + 1. StaleEpoch if
        node_epoch is not current; leaving twice is a no-op."""
        await self.fetch_one(WRITE, SQL_LEAVE, (node_id, node_epoch))

    async def drain_node(self, node_id: int, node_epoch: int | None, reason: str) -> bool:
        """Mark a node draining (sql/0027): the coordinator moves its partitions away and
        assigns it nothing. `node_epoch`: the node's own registration (a clean stop, reason
        'shutdown'; False unless current and live), or None (an operator, 'operator').
        UnknownNode for a node id never registered."""
        row = await self.fetch_one(WRITE, SQL_DRAIN_NODE, (node_id, node_epoch, reason))
        assert row is not None
        return bool(row[0])

    async def undrain_node(self, node_id: int) -> str | None:
        """Clear an operator's drain mark; returns the mark left (None: takes work again;
        'shutdown': that node is stopping). UnknownNode for a node id never registered."""
        row = await self.fetch_one(WRITE, SQL_UNDRAIN_NODE, (node_id,))
        assert row is not None
        return row[0]

    async def not_handed_over(self, node_id: int,
                              partitions: Sequence[tuple[uuid.UUID, int]]) -> int:
        """How many partitions a draining node still leads, or of `partitions` (what it led)
        are not yet open by their new leader at their current leader epoch: 0 once every
        one is writable elsewhere."""
        row = await self.fetch_one(READ, SQL_NOT_HANDED_OVER, {
            "node": node_id, "topics": [k[0] for k in partitions],
            "partitions": [k[1] for k in partitions]})
        assert row is not None
        return row[0]

    async def live_nodes(self) -> list[NodeInfo]:
        return [NodeInfo(*r) for r in await self.fetch_all(READ, SQL_LIVE_NODES)]

    async def nodes(self) -> list[NodeInfo]:
        """Every node ever registered, live or not."""
        return [NodeInfo(*r) for r in await self.fetch_all(READ, SQL_ALL_NODES)]

    async def fence_node(self, node_id: int, seen_epoch: int) -> int:
        """Takeover: register the dead node at seen_epoch + 1, so that (node_id, seen_epoch)
        can never commit again. Returns the node's epoch now (already past seen_epoch: nothing
        written). NodeAlive if it is live at seen_epoch; UnknownNode for an unknown node id."""
        row = await self.fetch_one(WRITE, SQL_FENCE_NODE, (node_id, seen_epoch))
        assert row is not None
        return row[0]

    # -- leases --------------------------------------------------------------------------------

    async def acquire_lease(self, scope: str, node_id: int, node_epoch: int, *,
                            ttl_s: float) -> int | None:
        """Take the lease if free or expired (or renew it if this incarnation holds it).
        Returns the lease epoch (grows with each new tenure), None if another node holds it.
        StaleEpoch if the node epoch is not current or the node is not live."""
        row = await self.fetch_one(WRITE, SQL_ACQUIRE_LEASE, (scope, node_id, node_epoch, ttl_s))
        assert row is not None
        return row[0]

    async def acquire_leases(self, scopes: Sequence[str], node_id: int, node_epoch: int, *,
                             ttl_s: float) -> dict[str, int | None]:
        """acquire_lease for many scopes in one round trip (held ones are renewed):
        scope -> lease epoch, or None where another node holds it. StaleEpoch as above."""
        if not scopes:
            return {}
        rows = await self.fetch_all(WRITE, SQL_ACQUIRE_LEASES,
                                    (node_id, node_epoch, ttl_s, list(scopes)))
        return {scope: epoch for scope, epoch in rows}

    async def renew_lease(self, scope: str, node_id: int, lease_epoch: int, *,
                          ttl_s: float) -> None:
        """StaleEpoch('lease_lost') if the lease expired or changed hands."""
        row = await self.fetch_one(IDEMPOTENT, SQL_RENEW_LEASE,
                                   (ttl_s, scope, node_id, lease_epoch))
        if row is None:
            raise StaleEpoch("lease_lost")

    async def release_lease(self, scope: str, node_id: int, lease_epoch: int) -> bool:
        row = await self.fetch_one(IDEMPOTENT, SQL_RELEASE_LEASE, (scope, node_id, lease_epoch))
        return row is not None

    async def renew_leases(self, held: dict[str, int], node_id: int, node_epoch: int, *,
                           ttl_s: float) -> dict[str, int]:
        """Renew leases this node holds (scope -> lease epoch) in one statement: the scopes
        renewed, with their epochs; a missing one was lost (expired, taken, or this node's
        epoch is stale)."""
        if not held:
            return {}
        rows = await self.fetch_all(IDEMPOTENT, SQL_RENEW_LEASES, {
            "scopes": list(held), "epochs": list(held.values()), "node": node_id,
            "node_epoch": node_epoch, "ttl": ttl_s})
        return {scope: epoch for scope, epoch in rows}

    async def leases(self, prefix: str = "") -> list[LeaseInfo]:
        pattern = prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        return [LeaseInfo(*r) for r in await self.fetch_all(READ, SQL_LEASES, (pattern,))]

    async def write_topic_stats(self, topic_id: uuid.UUID, scope: str, node_id: int,
                                lease_epoch: int) -> None:
        """Compute and store a topic's statistics, fenced by its writer lease: StaleEpoch
        ('lease_lost') unless `node_id` holds `scope` at `lease_epoch` right now."""
        row = await self.fetch_one(WRITE, SQL_WRITE_TOPIC_STATS, {
            "topic": topic_id, "scope": scope, "node": node_id, "epoch": lease_epoch})
        if row is None:
            raise StaleEpoch("lease_lost")

    async def write_topics_stats(self, writers: dict[uuid.UUID, int], node_id: int) -> int:
        """write_topic_stats for every topic id -> writer lease epoch in one statement; a
        topic whose lease `node_id` no longer holds at that epoch is skipped. How many rows
        changed."""
        rows = await self.fetch_all(WRITE, SQL_WRITE_TOPICS_STATS, {
            "topics": list(writers), "epochs": list(writers.values()), "node": node_id})
        return len(rows)

    async def topic_stats(self) -> dict[uuid.UUID, tuple[int, int, int]]:
        """topic id -> (partitions, records, bytes), as last computed by its writer."""
        return {r[0]: (r[1], r[2], r[3]) for r in await self.fetch_all(READ, SQL_TOPIC_STATS)}

    # -- topics --------------------------------------------------------------------------------

    async def create_topic(self, name: str, partitions: int, config: dict[str, Any],
                           leaders: Sequence[int | None], topic_id: uuid.UUID | None = None,
                           *, coordinator_epoch: int | None = None) -> TopicRecord:
        """Insert the topic and its partitions (leader epoch 0, the given leaders) and a
        change-log row, in one transaction. TopicExists, InvalidPartitions, StaleEpoch."""
        row = await self.fetch_one(WRITE, SQL_CREATE_TOPIC, (
            name, partitions, _json_encoder.encode(dict_to_pg(config or {})).decode(),
            list(leaders), topic_id, coordinator_epoch))
        assert row is not None
        return _topic_info(row)

    async def delete_topic(self, name: str | None = None, *, topic_id: uuid.UUID | None = None,
                           coordinator_epoch: int | None = None) -> uuid.UUID:
        """Delete a live topic by name or id: its partitions, index rows, producer states go
        (see unreferenced_objects for its data). UnknownTopic."""
        if name is None and topic_id is None:
            raise ValueError("delete_topic needs a name or a topic id")
        row = await self.fetch_one(WRITE, SQL_DELETE_TOPIC, (name, topic_id, coordinator_epoch))
        assert row is not None
        return row[0]

    async def create_partitions(self, name: str, new_total: int,
                                leaders_for_new: Sequence[int | None], *,
                                coordinator_epoch: int | None = None) -> TopicRecord:
        """Grow a topic to new_total partitions. InvalidPartitions unless it grows and one
        leader is given per new partition; UnknownTopic."""
        row = await self.fetch_one(WRITE, SQL_CREATE_PARTITIONS, (
            name, new_total, list(leaders_for_new), coordinator_epoch))
        assert row is not None
        return _topic_info(row)

    async def get_topics(self) -> list[TopicRecord]:
        return [_topic_info(r) for r in await self.fetch_all(READ, SQL_GET_TOPICS)]

    async def get_topic(self, name: str) -> TopicRecord | None:
        row = await self.fetch_one(READ, SQL_GET_TOPIC, (name,))
        return None if row is None else _topic_info(row)

    async def view(self) -> View:
        """Topics, partitions (leader, leader epoch, stream state), live nodes, coordinator and
        view version, from one snapshot. Note that liveness changes with time alone, without
        a change-log row."""
        row = await self.fetch_one(READ, SQL_VIEW)
        assert row is not None
        return _with_configs(_view_decoder.decode(row[0]))

    async def view_since(self, version: int) -> ViewDelta:
        """What a holder of the view at `version` needs to be current (-1: it holds nothing):
        the live nodes and the coordinator, and the topics the change log names after that
        version (those still live; `changed` names them all, deleted ones too), or, when the
        log no longer reaches back that far, every topic (`complete` false). One snapshot;
        its cost follows what changed, not how many topics exist."""
        row = await self.fetch_one(READ, SQL_VIEW_SINCE, {"since": version})
        assert row is not None
        return _with_configs(_view_delta_decoder.decode(row[0]))

    # -- leaders and streams -------------------------------------------------------------------

    async def lead_partition(self, topic_id: uuid.UUID, partition: int, node_id: int,
                             coordinator_epoch: int | None = None, *,
                             expected_leader_epoch: int | None = None) -> int:
        """LeadBucket: node_id leads the partition at the returned (new) leader epoch.
        StaleEpoch('stale_coordinator_epoch') unless coordinator_epoch is the live
        coordinator lease's epoch (None is refused: StaleEpoch('missing_coordinator_epoch'),
        no coordinator action runs unfenced); StaleEpoch('leader_epoch_changed') if
        expected_leader_epoch is given and is not the current one; UnknownTopic."""
        row = await self.fetch_one(WRITE, SQL_LEAD_PARTITION, (
            topic_id, partition, node_id, coordinator_epoch, expected_leader_epoch))
        assert row is not None
        return row[0]

    async def relead_own_partition(self, topic_id: uuid.UUID, partition: int, node_id: int,
                                   node_epoch: int, *, expected_leader_epoch: int) -> int:
        """The partition's leader takes a fresh leader epoch for itself (it restarted, or the
        node it took over from had opened the stream at this epoch). Not a coordinator action:
        fenced by the node epoch (StaleEpoch('stale_node_epoch') unless current and live), by
        leadership (LeaderMoved) and by the expected leader epoch
        (StaleEpoch('leader_epoch_changed')). Returns the new leader epoch."""
        row = await self.fetch_one(WRITE, SQL_RELEAD_OWN_PARTITION, (
            topic_id, partition, node_id, node_epoch, expected_leader_epoch))
        assert row is not None
        return row[0]

    async def lead_partitions(self, moves: Sequence[tuple[uuid.UUID, int, int, int | None]],
                              coordinator_epoch: int | None = None) -> list[int]:
        """Several LeadBuckets (topic_id, partition, node_id, expected_leader_epoch|None) in one
        transaction, all or none. Returns the new leader epochs, in order."""
        if not moves:
            return []
        rows = await self.fetch_all(WRITE, SQL_LEAD_PARTITIONS, (
            coordinator_epoch, [m[0] for m in moves], [m[1] for m in moves],
            [m[2] for m in moves], [m[3] for m in moves]))
        return [r[0] for r in rows]

    async def open_stream(self, topic_id: uuid.UUID, partition: int, leader_epoch: int,
                          node_id: int, node_epoch: int) -> StreamState:
        """OpenStream: refused unless node_id is the partition's leader at leader_epoch
        (LeaderMoved, with the current leader) and node_epoch is current (StaleEpoch; read
        without a lock: the partition-row lock and the leader epoch are the fence, see
        commit_wal).
        Records the opener and the leader epoch's start offset. Returns the state after."""
        row = await self.fetch_one(WRITE, SQL_OPEN_STREAM, (
            topic_id, partition, leader_epoch, node_id, node_epoch))
        assert row is not None
        return StreamState(*row)

    async def open_stream_with_producers(
            self, topic_id: uuid.UUID, partition: int, leader_epoch: int, node_id: int,
            node_epoch: int) -> tuple[StreamState, list[ProducerStateUpdate]]:
        """OpenStream (as open_stream) and the partition's producer states, read in the same
        transaction after the partition-row lock: a late CommitWal of an earlier opener is
        either in both (committed before) or refused (not_open_by_node)."""
        row = await self.fetch_one(WRITE, SQL_OPEN_STREAM_WITH_PRODUCERS, (
            topic_id, partition, leader_epoch, node_id, node_epoch))
        assert row is not None
        producers = [ProducerStateUpdate(pid, epoch, base64.b64decode(state))
                     for pid, epoch, state in msgspec.json.decode(row[-1])]
        return StreamState(*row[:-1]), producers

    async def open_streams_with_producers(
            self, opens: Sequence[tuple[uuid.UUID, int, int]], node_id: int, node_epoch: int,
            fresh: Collection[tuple[uuid.UUID, int]] = ()
    ) -> dict[tuple[uuid.UUID, int],
              tuple[StreamState, list[ProducerStateUpdate]] | MetadataError]:
        """open_stream_with_producers for many (topic id, partition, leader epoch) in one
        round trip and one transaction, those in `fresh` at a fresh leader epoch first
        (relead_own_partition, expecting the epoch given: the state's open_leader_epoch is
        the one opened at); each partition's refusal (StaleEpoch, LeaderMoved, UnknownTopic)
        is its own entry, not the batch's failure."""
        rows = await self.fetch_all(WRITE, SQL_OPEN_STREAMS, (
            [o[0] for o in opens], [o[1] for o in opens], [o[2] for o in opens],
            [(o[0], o[1]) in fresh for o in opens], node_id, node_epoch))
        out: dict = {}
        for topic_id, partition, refusal, message, detail, *stream, producers in rows:
            if refusal is not None:
                out[(topic_id, partition)] = _refusal(refusal, message or "", detail)
                continue
            out[(topic_id, partition)] = (StreamState(*stream), [
                ProducerStateUpdate(pid, epoch, base64.b64decode(state))
                for pid, epoch, state in msgspec.json.decode(producers)])
        return out

    async def close_stream(self, topic_id: uuid.UUID, partition: int, leader_epoch: int,
                           node_id: int, node_epoch: int) -> bool:
        """Close the stream if (node_id, node_epoch) opened it at leader_epoch and node_epoch
        is current; False (nothing changed) otherwise."""
        row = await self.fetch_one(IDEMPOTENT, SQL_CLOSE_STREAM, {
            "topic_id": topic_id, "partition": partition, "leader_epoch": leader_epoch,
            "node": node_id, "node_epoch": node_epoch})
        return row is not None

    async def close_streams(self, closes: Sequence[tuple[uuid.UUID, int, int]], node_id: int,
                            node_epoch: int) -> int:
        """close_stream for many (topic id, partition, leader epoch) in one statement; how
        many were closed."""
        rows = await self.fetch_all(IDEMPOTENT, SQL_CLOSE_STREAMS, {
            "topic_ids": [c[0] for c in closes], "partitions": [c[1] for c in closes],
            "epochs": [c[2] for c in closes], "node": node_id, "node_epoch": node_epoch})
        return len(rows)

    async def stream_state(self, topic_id: uuid.UUID, partition: int) -> StreamState | None:
        row = await self.fetch_one(READ, SQL_STREAM_STATE, (topic_id, partition))
        return None if row is None else StreamState(*row)

    async def stream_states(self, keys: Sequence[tuple[uuid.UUID, int]]
                            ) -> dict[tuple[uuid.UUID, int], StreamState]:
        """The stream states of these partitions (those that exist), in one statement."""
        rows = await self.fetch_all(READ, SQL_STREAM_STATES,
                                    ([k[0] for k in keys], [k[1] for k in keys]))
        return {(r[0], r[1]): StreamState(*r) for r in rows}

    # -- CommitWal -----------------------------------------------------------------------------

    async def commit_wal(self, node_id: int, node_epoch: int,
                         objects: Sequence[WalObject]) -> list[CommitOutcome]:
        """CommitWal for uploaded WAL objects: one round trip, one transaction.

        Returns one CommitOutcome per object, in order, with one RangeOutcome per range.
        A stale node epoch does not raise: every range of every (new) object is refused with
        reason 'stale_node_epoch' and nothing is written. Otherwise each range is decided on
        its own (see mink_commit_wal in 0002_operations.sql for the reasons; 0031 redefines
        it at less CPU). Keyed by object key: a key decided before returns its first outcome
        (repeated=True) and changes nothing, so this is safe to call again after
        OutcomeUnknown.

        Where the epochs are checked: the node epoch is read without a lock (a
        registration or fence may commit just after the check). That is safe because the
        real fence is per partition, under its row lock (FOR UPDATE): the stream must be open
        by this very (node, node epoch) at the range's leader epoch. A new incarnation or a
        new leader opens the stream under the same lock before it accepts anything, so a
        commit that passed the node-epoch check late is refused (not_open_by_node)."""
        if not objects:
            return []
        keys = [o.key for o in objects]
        if len(set(keys)) != len(keys):
            raise ValueError("duplicate object keys in one commit_wal call")
        payload = _json_encoder.encode(objects).decode()
        rows = await self.fetch_all(IDEMPOTENT, SQL_COMMIT_WAL, (node_id, node_epoch, payload))
        found = {key: (outcome, repeated) for key, outcome, repeated in rows}
        return [_outcome(o.key, *found[o.key], len(o.ranges)) for o in objects]

    async def commit_outcome(self, keys: Sequence[str], *,
                             settle: bool = True) -> dict[str, CommitOutcome | None]:
        """Read back what CommitWal decided for these keys (after a timeout or a lost
        connection). Waits for a commit of them still running in PostgreSQL.
        None: not committed. With settle (the default) a key nobody decided on is abandoned
        first, so that "not committed" stays true: a late CommitWal of it is refused
        (reason 'abandoned') and the object is queued for deletion. A key whose ranges were
        all refused returns its CommitOutcome (committed=False)."""
        keys = list(dict.fromkeys(keys))
        rows = await self.fetch_all(IDEMPOTENT, SQL_COMMIT_OUTCOME, (keys, settle))
        result: dict[str, CommitOutcome | None] = dict.fromkeys(keys)
        for key, outcome in rows:
            decoded = _outcome(key, outcome, True, 0)
            result[key] = None if decoded.reason == "abandoned" else decoded
        return result

    # -- reads ---------------------------------------------------------------------------------

    async def find_batches(self, topic_id: uuid.UUID, partition: int, from_offset: int,
                           max_rows: int = 100) -> list[IndexRow]:
        """Index rows with last_offset >= from_offset, in offset order."""
        rows = await self.fetch_all(READ, SQL_FIND_BATCHES,
                                    (topic_id, partition, from_offset, max_rows))
        return [IndexRow(*r) for r in rows]

    async def offset_for_timestamp(self, topic_id: uuid.UUID, partition: int,
                                   ts: int) -> IndexRow | None:
        """The first index row (by offset) whose max_timestamp >= ts."""
        row = await self.fetch_one(READ, SQL_OFFSET_FOR_TIMESTAMP,
                                   {"t": topic_id, "p": partition, "ts": ts})
        return None if row is None else IndexRow(*row)

    async def leader_epoch_end(self, topic_id: uuid.UUID, partition: int,
                               requested_epoch: int) -> tuple[int, int]:
        """Kafka's OffsetForLeaderEpoch (LeaderEpochFileCache.endOffsetFor): the largest leader
        epoch <= requested and its end offset (the next epoch's start offset, or the committed
        end for the latest epoch). (-1, -1) if requested is -1, above every known epoch, or the
        partition never opened; (requested, first epoch's start) if below every known epoch.
        UnknownTopic if the partition does not exist."""
        row = await self.fetch_one(READ, SQL_LEADER_EPOCH_END,
                                   {"t": topic_id, "p": partition, "epoch": requested_epoch})
        if row is None:
            raise UnknownTopic(f"unknown partition {topic_id}/{partition}")
        committed_end, latest, floor_epoch, higher_start = row
        if requested_epoch < 0 or latest is None:
            return (-1, -1)
        if requested_epoch == latest:
            return (requested_epoch, committed_end)
        if higher_start is None:
            return (-1, -1)
        if floor_epoch is None:
            return (requested_epoch, higher_start)
        return (floor_epoch, higher_start)

    async def producer_states(self, topic_id: uuid.UUID, partition: int) -> list[ProducerState]:
        rows = await self.fetch_all(READ, SQL_PRODUCER_STATES, (topic_id, partition))
        return [ProducerState(*r) for r in rows]

    # -- change log ----------------------------------------------------------------------------

    async def changes_since(self, version: int, limit: int = 1000) -> tuple[list[Change], int]:
        """Change-log rows with version > `version` (at most `limit`, in order) and the current
        view version, from one snapshot. Versions have no gaps; if the list is shorter than
        current - version, call again from its last version."""
        rows = await self.fetch_all(READ, SQL_CHANGES_SINCE, (version, limit))
        current = rows[0][0]
        changes = [Change(v, kind, body, at) for _c, v, kind, body, at in rows if v is not None]
        return changes, current

    @asynccontextmanager
    async def listen(self, channel: str = NOTIFY_CHANNEL) -> AsyncIterator[Listener]:
        """Wake-ups on NOTIFY 'mink_view' (or another `channel`; on a dedicated connection,
        not the pool).

            async with store.listen() as wakeups:
                async for version_hint in wakeups:
                    changes, current = await store.changes_since(last)

        Entering returns once LISTEN is active (MetadataUnavailable after `timeout` s).
        Wake-ups coalesce; each is a hint (the notified version, or None after the
        listener reconnected, when notifications may have been missed). A lost connection is
        re-established in the background; read `changes_since` after every wake-up and poll
        now and then anyway (liveness changes with time alone)."""
        listener = Listener()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio_asyncio.aio_as_trio(self._aio_pump), listener, channel)
            try:
                with trio.fail_after(self.timeout):
                    await listener._connected_event.wait()
            except trio.TooSlowError:
                raise MetadataUnavailable("LISTEN connection not established") from None
            try:
                yield listener
            finally:
                nursery.cancel_scope.cancel()

    async def _aio_pump(self, listener: Listener, channel: str = NOTIFY_CHANNEL) -> None:
        """asyncio side of listen(): connect, LISTEN, push notifications into the channel."""
        delay = 0.1
        while True:
            conn = None
            try:
                conn = await psycopg.AsyncConnection.connect(self.conninfo, **self._kwargs)
                await conn.execute(f"LISTEN {channel}")
                delay = 0.1
                listener.connected = True
                if listener._connected_event.is_set():
                    listener._wake(None)  # reconnected: something may have been missed
                else:
                    listener._connected_event.set()
                async for notify in conn.notifies():
                    try:
                        listener._wake(int(notify.payload))
                    except ValueError:
                        listener._wake(None)
            except psycopg.Error as e:
                logger.info("LISTEN connection lost: %s", e)
            finally:
                listener.connected = False
                if conn is not None:
                    await conn.close()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)

    # -- garbage -------------------------------------------------------------------------------

    async def unreferenced_objects(self, limit: int = 1000) -> list[str]:
        """Committed WAL objects no index row uses any more (moved by tiering, topic deleted),
        not queued for deletion yet. Pass them to queue_for_deletion."""
        return [r[0] for r in await self.fetch_all(READ, SQL_UNREFERENCED_OBJECTS, (limit,))]

    async def queue_for_deletion(self, keys: Sequence[str], reason: str) -> list[str]:
        """Queue object keys for deletion, except those an index row still uses; keys never
        decided by CommitWal are abandoned (can never be committed). Returns those queued."""
        rows = await self.fetch_all(IDEMPOTENT, SQL_QUEUE_FOR_DELETION, (list(keys), reason))
        return [r[0] for r in rows]

    async def pending_deletions(self, limit: int = 1000) -> list[tuple[str, str]]:
        """(key, reason) of queued objects, oldest first."""
        return [(k, r) for k, r in await self.fetch_all(READ, SQL_PENDING_DELETIONS, (limit,))]

    async def deletions_done(self, keys: Sequence[str]) -> None:
        """The garbage collector deleted these objects from the store."""
        await self._one_no_result(IDEMPOTENT, SQL_DELETIONS_DONE, (list(keys),))

    async def _one_no_result(self, kind: StatementKind, sql: str, params: Any) -> None:
        async def op(conn: psycopg.AsyncConnection) -> None:
            await conn.execute(sql, params)
        await self._run(kind, op)


def _outcome(key: str, stored: str, repeated: bool, n_ranges: int) -> CommitOutcome:
    s = _outcome_decoder.decode(stored)
    ranges = s.ranges
    if s.reason is not None and len(ranges) < n_ranges:  # abandoned: no ranges were stored
        ranges = [RangeOutcome(False, s.reason, None)] * n_ranges
    return CommitOutcome(key=key, committed=s.committed, ranges=ranges, repeated=repeated,
                         reason=s.reason)
