-- Issue 16's last pieces: committed offsets expire (KIP-211), topic statistics are kept by
-- deltas, and a restart's settling starts after what earlier restarts settled.


-- == Committed-offsets expiry (KIP-211) ======================================================
--
-- The group coordinator (the leader of the group's partition of __consumer_offsets) runs
-- this for one group at a time, in the group's order of writes (after every commit it
-- accepted before), every offsets.retention.check.interval.ms. It decides the condition from
-- the group's state in its memory, as Kafka's ClassicGroup.offsetExpirationCondition does:
--   'empty'      a group with a protocol type and no members: every offset expires once
--                offsets.retention has passed since the group became Empty (Kafka's
--                currentStateTimestamp: consumer_groups.updated_at, which only
--                mink_store_group writes, and it wrote the Empty state last);
--   'simple'     a group no member ever joined (standalone consumers using Kafka for their
--                offsets): each offset expires offsets.retention after its own commit;
--   'subscribed' a Stable consumer group: offsets of topics no member subscribes to any
--                more (p_kept_topics are the subscribed ones) expire by their commit time.
-- A group of any other state keeps everything. Time is PostgreSQL's clock (committed_at and
-- updated_at are written with it). An 'empty' or 'simple' group left without offsets is
-- deleted, as Kafka's cleanupGroupMetadata makes it Dead.
--
-- Returns json: {"coordinator": false} when fenced; {"coordinator": true, "stale": true}
-- when the stored state still has members (the Empty state's write was lost: the caller
-- writes it again, which starts the clock); otherwise {"coordinator": true, "expired": n,
-- "kept": [[topic, partition], ...], "group_deleted": bool}. "kept" rather than what went,
-- so that a repeat after an unknown outcome still leaves the caller's cache right.
CREATE FUNCTION mink_expire_group_offsets(p_topic_id uuid, p_partition integer,
                                          p_leader_epoch integer, p_node integer,
                                          p_node_epoch bigint, p_group_id text, p_mode text,
                                          p_kept_topics text[], p_retention_ms bigint)
RETURNS json
LANGUAGE plpgsql AS $$
DECLARE
    g       consumer_groups;
    v_limit timestamptz := now() - p_retention_ms * interval '1 millisecond';
    v_gone  bigint;
    v_kept  json;
    v_dead  boolean := false;
BEGIN
    IF NOT mink_check_group_coordinator(p_topic_id, p_partition, p_leader_epoch, p_node,
                                        p_node_epoch) THEN
        RETURN json_build_object('coordinator', false);
    END IF;
    SELECT * INTO g FROM consumer_groups WHERE group_id = p_group_id FOR UPDATE;
    IF NOT FOUND THEN  -- deleted by an earlier call (or never written)
        RETURN json_build_object('coordinator', true, 'expired', 0, 'kept', '[]'::json,
                                 'group_deleted', p_mode IN ('empty', 'simple'));
    END IF;
    IF p_mode = 'empty' AND json_array_length(g.members) > 0 THEN
        RETURN json_build_object('coordinator', true, 'stale', true);
    END IF;

    WITH gone AS (
        DELETE FROM group_offsets AS o
         WHERE o.group_id = p_group_id
           AND CASE p_mode
                 WHEN 'empty' THEN g.updated_at <= v_limit
                 WHEN 'simple' THEN o.committed_at <= v_limit
                 WHEN 'subscribed' THEN o.committed_at <= v_limit
                                        AND o.topic <> ALL (coalesce(p_kept_topics, '{}'))
                 ELSE false
               END
        RETURNING 1)
    SELECT count(*) INTO v_gone FROM gone;
    SELECT coalesce(json_agg(json_build_array(o.topic, o.partition)), '[]'::json) INTO v_kept
      FROM group_offsets AS o WHERE o.group_id = p_group_id;

    IF p_mode IN ('empty', 'simple') AND json_array_length(v_kept) = 0 THEN
        DELETE FROM consumer_groups WHERE group_id = p_group_id;
        v_dead := true;
    END IF;
    RETURN json_build_object('coordinator', true, 'expired', v_gone, 'kept', v_kept,
                             'group_deleted', v_dead);
END $$;


-- == Topic statistics in proportion to change (seed 001, "statistics") =====================
--
-- partition_stats holds each partition's indexed bytes and index rows, kept by deltas in the
-- transaction that changes the index: a WAL commit adds its rows' bytes, a retention step, a
-- DeleteRecords, a topic deletion (and later tiering's swaps) subtract the rows they delete.
-- Every such statement already holds the partitions' row locks (in partition order), so
-- these updates add no lock order of their own. The writer's statistics round
-- (SQL_WRITE_TOPIC_STATS) then sums one row per partition, never the index rows.
CREATE TABLE partition_stats (
    topic_id      uuid    NOT NULL,
    partition     integer NOT NULL,
    indexed_bytes bigint  NOT NULL DEFAULT 0,
    index_rows    bigint  NOT NULL DEFAULT 0,
    PRIMARY KEY (topic_id, partition),
    FOREIGN KEY (topic_id, partition) REFERENCES partitions (topic_id, partition)
        ON DELETE CASCADE
);

-- One row per partition from its creation on (so a commit only ever updates), filled here
-- for the partitions that exist already.
INSERT INTO partition_stats (topic_id, partition, indexed_bytes, index_rows)
SELECT p.topic_id, p.partition, coalesce(sum(b.byte_end - b.byte_start), 0), count(b.*)
  FROM partitions AS p
  LEFT JOIN batch_index AS b ON b.topic_id = p.topic_id AND b.partition = p.partition
 GROUP BY p.topic_id, p.partition;

CREATE FUNCTION mink_partition_created_stats() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO partition_stats (topic_id, partition)
    SELECT n.topic_id, n.partition FROM new_partitions AS n
    ON CONFLICT (topic_id, partition) DO NOTHING;
    RETURN NULL;
END $$;

CREATE TRIGGER partition_created_stats AFTER INSERT ON partitions
    REFERENCING NEW TABLE AS new_partitions
    FOR EACH STATEMENT EXECUTE FUNCTION mink_partition_created_stats();

-- One call per statement (transition tables): the change of each partition it touched.
CREATE FUNCTION mink_batch_index_added() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE partition_stats AS s
       SET indexed_bytes = s.indexed_bytes + g.bytes, index_rows = s.index_rows + g.rows
      FROM (SELECT n.topic_id, n.partition, sum(n.byte_end - n.byte_start) AS bytes,
                   count(*) AS rows
              FROM new_rows AS n GROUP BY n.topic_id, n.partition) AS g
     WHERE s.topic_id = g.topic_id AND s.partition = g.partition;
    RETURN NULL;
END $$;

CREATE FUNCTION mink_batch_index_removed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE partition_stats AS s
       SET indexed_bytes = s.indexed_bytes - g.bytes, index_rows = s.index_rows - g.rows
      FROM (SELECT o.topic_id, o.partition, sum(o.byte_end - o.byte_start) AS bytes,
                   count(*) AS rows
              FROM gone_rows AS o GROUP BY o.topic_id, o.partition) AS g
     WHERE s.topic_id = g.topic_id AND s.partition = g.partition;
    RETURN NULL;
END $$;

CREATE TRIGGER batch_index_stats_added AFTER INSERT ON batch_index
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION mink_batch_index_added();
CREATE TRIGGER batch_index_stats_removed AFTER DELETE ON batch_index
    REFERENCING OLD TABLE AS gone_rows
    FOR EACH STATEMENT EXECUTE FUNCTION mink_batch_index_removed();

-- A deleted topic's statistics go with it (its topics row stays: ids are never reused).
CREATE FUNCTION mink_topic_deleted_stats() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM topic_stats WHERE topic_id = NEW.topic_id;
    RETURN NULL;
END $$;

CREATE TRIGGER topic_deleted_stats AFTER UPDATE OF deleted_at ON topics
    FOR EACH ROW WHEN (OLD.deleted_at IS NULL AND NEW.deleted_at IS NOT NULL)
    EXECUTE FUNCTION mink_topic_deleted_stats();


-- == A restart settles in proportion to what PostgreSQL does not know =====================
--
-- A node restarting as epoch E must find the objects its earlier epochs uploaded but never
-- got decided (a crash between upload and commit). Without a record of how far that is known
-- it lists every object its earlier epochs still have in the store: history. Two marks bound
-- the listing to what is unknown:
--   through_seq  the running writer of (node_id, node_epoch) records, every few seconds, the
--                sequence number up to which each of its objects is decided (commits run in
--                sequence order); a restart lists that epoch only after it (StartAfter);
--   complete     a restart that settled every earlier epoch marks the newest of them; later
--                restarts never look at those epochs again (and their rows go).
-- A missing mark only means a longer listing, never a missed orphan.
CREATE TABLE wal_settled (
    node_id     integer NOT NULL,
    node_epoch  bigint  NOT NULL,
    through_seq bigint  NOT NULL DEFAULT 0,
    complete    boolean NOT NULL DEFAULT false,
    PRIMARY KEY (node_id, node_epoch)
);
