-- Per-topic statistics, computed by the holder of the topic's writer lease (seed 001) and
-- written only while that lease is held at the epoch the writer names.
CREATE TABLE topic_stats (
    topic_id    uuid        PRIMARY KEY REFERENCES topics (topic_id) ON DELETE CASCADE,
    partitions  integer     NOT NULL,
    records     bigint      NOT NULL,   -- sum over partitions of committed end - log start
    bytes       bigint      NOT NULL,   -- bytes of indexed batches
    computed_by integer     NOT NULL,
    lease_epoch bigint      NOT NULL,
    computed_at timestamptz NOT NULL DEFAULT now()
);
