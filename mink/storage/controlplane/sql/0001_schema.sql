-- Mink metadata schema: the cluster view (state tables + change log), node membership,
-- leases, topics and partitions with their stream state, the WAL object index.
--
-- Conventions
--   * Every time comparison uses PostgreSQL's clock (now()), never a node's.
--   * A row "expires" when expires_at <= now(); '-infinity' marks a clean leave / release.
--   * Epochs only grow.

-- One row: cluster identity and the serialized counters.
CREATE TABLE cluster (
    singleton        boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    -- Kafka cluster id: 22 characters of url-safe base64, like Kafka's Uuid.toString()
    cluster_id       text        NOT NULL,
    -- Version of the last change-log row. Every transaction that writes a change-log row
    -- increments it (UPDATE ... RETURNING), which serializes control-plane writers: versions
    -- become visible in order, so a reader of `version > last` never misses a row.
    view_version     bigint      NOT NULL DEFAULT 0,
    -- Next free Kafka producer id (InitProducerId), handed out in blocks.
    next_producer_id bigint      NOT NULL DEFAULT 0,
    created_at       timestamptz NOT NULL DEFAULT now()
);

INSERT INTO cluster (cluster_id)
VALUES (rtrim(translate(encode(uuid_send(gen_random_uuid()), 'base64'), '+/', '-_'), '='));

-- Control-plane changes only: topics created/deleted/grown, leaders changed, nodes
-- registered/left/fenced. Data commits and offset commits never write here.
CREATE TABLE change_log (
    version bigint      PRIMARY KEY,
    kind    text        NOT NULL,
    body    jsonb       NOT NULL,
    at      timestamptz NOT NULL DEFAULT now()
);

-- Membership. A node's row is never deleted, so its epoch keeps growing across restarts.
CREATE TABLE nodes (
    node_id       integer     PRIMARY KEY,
    epoch         bigint      NOT NULL,
    host          text        NOT NULL,
    port          integer     NOT NULL,
    rack          text,
    registered_at timestamptz NOT NULL DEFAULT now(),
    -- live while expires_at > now(); '-infinity' after a clean leave
    expires_at    timestamptz NOT NULL
);

-- Leases: the coordinator lease ('coordinator'), seed-001 writer and partition leases.
CREATE TABLE leases (
    scope        text        PRIMARY KEY,
    holder       integer,               -- node id of the (last) holder
    holder_epoch bigint,                -- that node's epoch when it acquired the lease
    epoch        bigint      NOT NULL,  -- lease epoch: grows each time the lease changes hands
    acquired_at  timestamptz,
    expires_at   timestamptz NOT NULL   -- held while > now(); '-infinity' once released
);

CREATE TABLE topics (
    topic_id   uuid        PRIMARY KEY,
    name       text        NOT NULL,
    partitions integer     NOT NULL CHECK (partitions > 0),
    config     jsonb       NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    deleted_at timestamptz
);
-- A name is unique among live topics; deleted topics keep their row (and id).
CREATE UNIQUE INDEX topics_live_name ON topics (name) WHERE deleted_at IS NULL;

-- One row per partition of a live topic: its leader (written by the coordinator) and the
-- state of its stream (written by the leader: OpenStream, CommitWal, CloseStream).
CREATE TABLE partitions (
    topic_id          uuid    NOT NULL REFERENCES topics (topic_id),
    partition         integer NOT NULL CHECK (partition >= 0),
    leader_node       integer,
    leader_epoch      integer NOT NULL DEFAULT 0,
    -- stream state; opened_by_* and open_leader_epoch describe the last open, and stay
    -- after a close ("closed at leader epoch N")
    stream_state      text    NOT NULL DEFAULT 'closed' CHECK (stream_state IN ('closed', 'open')),
    opened_by_node    integer,
    opened_by_epoch   bigint,           -- node epoch of the opener
    open_leader_epoch integer,
    log_start_offset  bigint  NOT NULL DEFAULT 0,
    committed_end     bigint  NOT NULL DEFAULT 0,   -- = high watermark = log end offset
    max_timestamp     bigint  NOT NULL DEFAULT -1,  -- largest batch max_timestamp committed
    PRIMARY KEY (topic_id, partition)
);

-- Start offset of each leader epoch (Kafka's leader-epoch cache, for OffsetForLeaderEpoch),
-- recorded at OpenStream.
CREATE TABLE leader_epochs (
    topic_id     uuid    NOT NULL,
    partition    integer NOT NULL,
    leader_epoch integer NOT NULL,
    start_offset bigint  NOT NULL,
    PRIMARY KEY (topic_id, partition, leader_epoch)
);

-- Every WAL object key CommitWal (or an outcome read-back, or deletion queueing) has decided
-- on. `outcome` is the first decision, returned again to any repeated CommitWal of the key:
--   {"committed": bool, "reason": text|null, "ranges": [[accepted, reason, committed_end], ...]}
-- committed = false: every range was refused, or the key was abandoned (reason 'abandoned',
-- no ranges, node/size unknown) so that a late CommitWal of it can never succeed.
CREATE TABLE wal_objects (
    key          text        PRIMARY KEY,
    node_id      integer,
    node_epoch   bigint,
    size         bigint,
    committed    boolean     NOT NULL,
    decided_at   timestamptz NOT NULL DEFAULT now(),
    outcome      jsonb       NOT NULL,
    gc_queued_at timestamptz           -- set once the key went to objects_to_delete
);
-- garbage-collection scan: committed objects not yet queued
CREATE INDEX wal_objects_gc ON wal_objects (decided_at) WHERE committed AND gc_queued_at IS NULL;

-- The index: one row per (object, partition range), never one per record batch.
-- Ranges of a partition do not overlap; rows are ordered by offset.
CREATE TABLE batch_index (
    topic_id              uuid    NOT NULL,
    partition             integer NOT NULL,
    base_offset           bigint  NOT NULL,
    last_offset           bigint  NOT NULL,
    object_key            text    NOT NULL,
    byte_start            bigint  NOT NULL,
    byte_end              bigint  NOT NULL,
    max_timestamp         bigint  NOT NULL,
    batch_count           integer NOT NULL,
    -- max(max_timestamp) over this row and every earlier row of the partition: grows with
    -- the offset, so "first row with max_timestamp >= ts" is an index lookup
    running_max_timestamp bigint  NOT NULL,
    PRIMARY KEY (topic_id, partition, base_offset),
    CHECK (last_offset >= base_offset AND byte_end >= byte_start)
);
CREATE INDEX batch_index_last_offset ON batch_index (topic_id, partition, last_offset);
CREATE INDEX batch_index_timestamp ON batch_index (topic_id, partition, running_max_timestamp, base_offset);
CREATE INDEX batch_index_object ON batch_index (object_key);

-- Idempotent-producer state per partition, opaque here (the last batches' sequences and offsets).
CREATE TABLE producer_state (
    topic_id       uuid        NOT NULL,
    partition      integer     NOT NULL,
    producer_id    bigint      NOT NULL,
    producer_epoch integer     NOT NULL,
    state          bytea       NOT NULL,
    updated_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic_id, partition, producer_id)
);

-- Object-store keys to delete (uncommitted or abandoned uploads, objects no index row uses).
CREATE TABLE objects_to_delete (
    key       text        PRIMARY KEY,
    reason    text        NOT NULL,
    queued_at timestamptz NOT NULL DEFAULT now()
);
