-- The storage lifecycle: retention (time, size), DeleteRecords, topic config changes, and
-- collection of what no index row references any more, with its metadata.
--
-- Lock order (as in 0002_operations.sql): leases, topics, partitions (by topic_id,
-- partition), object-key advisory locks of keys that lost their last index row (these are
-- old, committed keys: no CommitWal of them can hold a partition lock), the `cluster` row.


-- Objects whose last index row went (retention, DeleteRecords, a deleted topic). A reader
-- may still hold an index row it resolved before: the object is only queued for deletion
-- once `file.delete.delay.ms` has passed since `since`, on PostgreSQL's clock.
CREATE TABLE unreferenced_objects (
    key   text        PRIMARY KEY,
    since timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX unreferenced_objects_since ON unreferenced_objects (since);

-- The collector deletes rows of wal_objects once their object is gone from the store.
CREATE INDEX wal_objects_collected ON wal_objects (gc_queued_at) WHERE gc_queued_at IS NOT NULL;
-- Expiry of idle producers' state.
CREATE INDEX producer_state_updated ON producer_state (updated_at);
-- Change-log pruning and the size of the kept window.
CREATE INDEX change_log_at ON change_log (at);


-- Keys whose index rows were just deleted: the ones no row uses any more become
-- unreferenced (and are kept out of the committed-object scan of the older collector).
-- Advisory locks on the keys serialize two truncations that drop the last rows of one
-- shared WAL object in two partitions: the second sees the first one's deletion.
CREATE FUNCTION mink_release_objects(p_keys text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(cardinality(p_keys), 0) = 0 THEN
        RETURN;
    END IF;
    PERFORM mink_lock_object_keys(p_keys);
    WITH unused AS (
        SELECT DISTINCT k AS key FROM unnest(p_keys) AS k
         WHERE NOT EXISTS (SELECT 1 FROM batch_index AS b WHERE b.object_key = k)
    ), marked AS (
        UPDATE wal_objects AS w SET gc_queued_at = now()
          FROM unused AS u WHERE w.key = u.key AND w.gc_queued_at IS NULL
    )
    INSERT INTO unreferenced_objects (key)
    SELECT key FROM unused
    ON CONFLICT (key) DO NOTHING;
END $$;


-- Every deletion of index rows (retention, DeleteRecords, a topic deleted, later tiering's
-- swaps) releases the objects that lost their last row: collection is driven by this queue,
-- never by a scan of every committed object. One call per statement (transition table).
CREATE FUNCTION mink_batch_index_released() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM mink_release_objects(ARRAY(SELECT DISTINCT object_key FROM gone_rows));
    RETURN NULL;
END $$;

CREATE TRIGGER batch_index_released AFTER DELETE ON batch_index
    REFERENCING OLD TABLE AS gone_rows
    FOR EACH STATEMENT EXECUTE FUNCTION mink_batch_index_released();


-- Move a partition's log start to p_offset: only forward (GREATEST), never above the high
-- watermark (LEAST). Index rows wholly below it go, their objects are released if no row
-- uses them any more, the leader-epoch cache is truncated from the start as Kafka's
-- LeaderEpochFileCache.truncateFromStart does. The caller holds the partition's row lock
-- and checked its fence. Returns the log start after.
CREATE FUNCTION mink_truncate_head(p_topic_id uuid, p_partition integer, p_offset bigint)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_before bigint;
    v_start  bigint;
BEGIN
    SELECT log_start_offset INTO v_before FROM partitions
     WHERE topic_id = p_topic_id AND partition = p_partition;
    UPDATE partitions
       SET log_start_offset = greatest(log_start_offset, least(p_offset, committed_end))
     WHERE topic_id = p_topic_id AND partition = p_partition
    RETURNING log_start_offset INTO v_start;
    IF v_start IS NULL OR v_start = v_before THEN
        RETURN v_start;
    END IF;

    -- (the objects whose last row goes are released by batch_index_released)
    DELETE FROM batch_index
     WHERE topic_id = p_topic_id AND partition = p_partition AND last_offset < v_start;

    DELETE FROM leader_epochs AS e
     WHERE e.topic_id = p_topic_id AND e.partition = p_partition AND e.start_offset < v_start
       AND EXISTS (SELECT 1 FROM leader_epochs AS n
                    WHERE n.topic_id = e.topic_id AND n.partition = e.partition
                      AND n.leader_epoch > e.leader_epoch AND n.start_offset <= v_start);
    UPDATE leader_epochs SET start_offset = v_start
     WHERE topic_id = p_topic_id AND partition = p_partition AND start_offset < v_start;
    RETURN v_start;
END $$;


-- The offset below which a partition's data is past retention (Kafka's
-- UnifiedLog.deleteRetentionMsBreachedSegments / deleteRetentionSizeBreachedSegments, with
-- one index row as the unit Kafka calls a segment):
--   time: rows are deleted from the oldest while their batches' max timestamp is older than
--         now - retention.ms; running_max_timestamp makes "the first row that is not" one
--         index lookup. No such row: every record is past retention, the log empties.
--   size: a row is deleted while the rows after it still hold at least retention.bytes.
-- -1 disables either.
CREATE FUNCTION mink_retention_offset(p_topic_id uuid, p_partition integer,
                                      p_log_start bigint, p_committed_end bigint,
                                      p_now_ms bigint, p_retention_ms bigint,
                                      p_retention_bytes bigint) RETURNS bigint
LANGUAGE plpgsql STABLE AS $$
DECLARE
    v_time bigint := p_log_start;
    v_size bigint := p_log_start;
BEGIN
    IF p_retention_ms >= 0 THEN
        SELECT coalesce(min(base_offset), p_committed_end) INTO v_time
          FROM (SELECT base_offset FROM batch_index
                 WHERE topic_id = p_topic_id AND partition = p_partition
                   AND running_max_timestamp >= p_now_ms - p_retention_ms
                 ORDER BY running_max_timestamp, base_offset LIMIT 1) AS kept;
    END IF;
    IF p_retention_bytes >= 0 THEN
        SELECT coalesce(min(s.base_offset), p_committed_end) INTO v_size
          FROM (SELECT base_offset,
                       sum(byte_end - byte_start) OVER (ORDER BY base_offset DESC)
                         - (byte_end - byte_start) AS after
                  FROM batch_index
                 WHERE topic_id = p_topic_id AND partition = p_partition) AS s
         WHERE s.after < p_retention_bytes;
    END IF;
    RETURN greatest(v_time, v_size);
END $$;


-- Retention of one topic, by the holder of its writer lease at that lease epoch (seed 001,
-- "expiry"). One transaction; only the partitions whose log start moves are locked (in
-- order, until the end of the transaction: their leaders' commits wait that long). Returns
-- those partitions. A NOTIFY on 'mink_log_start' (no change-log row) tells their leaders.
CREATE FUNCTION mink_apply_retention(p_topic_id uuid, p_scope text, p_node integer,
                                     p_lease_epoch bigint, p_retention_ms bigint,
                                     p_retention_bytes bigint)
RETURNS TABLE (partition integer, log_start_offset bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_now_ms bigint := (extract(epoch FROM now()) * 1000)::bigint;
    p        record;
    v_offset bigint;
    v_start  bigint;
    v_moved  boolean := false;
BEGIN
    PERFORM 1 FROM leases AS l
     WHERE l.scope = p_scope AND l.holder = p_node AND l.epoch = p_lease_epoch
       AND l.expires_at > now()
       FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MK001', MESSAGE = 'lease_lost';
    END IF;
    FOR p IN SELECT x.partition, x.log_start_offset, x.committed_end FROM partitions AS x
              WHERE x.topic_id = p_topic_id ORDER BY x.partition
    LOOP
        v_offset := mink_retention_offset(p_topic_id, p.partition, p.log_start_offset,
                                          p.committed_end, v_now_ms, p_retention_ms,
                                          p_retention_bytes);
        CONTINUE WHEN v_offset <= p.log_start_offset;
        PERFORM 1 FROM partitions AS x
         WHERE x.topic_id = p_topic_id AND x.partition = p.partition FOR UPDATE;
        v_start := mink_truncate_head(p_topic_id, p.partition, v_offset);
        IF v_start > p.log_start_offset THEN
            v_moved := true;
            partition := p.partition;
            log_start_offset := v_start;
            RETURN NEXT;
        END IF;
    END LOOP;
    IF v_moved THEN
        PERFORM pg_notify('mink_log_start', p_topic_id::text);
    END IF;
END $$;


-- DeleteRecords, answered by the partition's leader: fenced like a WAL commit (the stream
-- is open by this node incarnation at this leader epoch, which is current). p_offset -1
-- means the high watermark. Returns (error, low watermark): error NULL, 'unknown_partition',
-- 'not_leader' or 'offset_out_of_range' (an offset above the high watermark or below -1).
CREATE FUNCTION mink_delete_records(p_topic_id uuid, p_partition integer,
                                    p_leader_epoch integer, p_node integer,
                                    p_node_epoch bigint, p_offset bigint)
RETURNS TABLE (error text, low_watermark bigint)
LANGUAGE plpgsql AS $$
DECLARE
    p partitions;
BEGIN
    SELECT * INTO p FROM partitions
     WHERE topic_id = p_topic_id AND partition = p_partition FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'unknown_partition'::text, -1::bigint;
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM nodes WHERE node_id = p_node AND epoch = p_node_epoch)
       OR p.leader_node IS DISTINCT FROM p_node OR p.leader_epoch <> p_leader_epoch
       OR p.stream_state <> 'open' OR p.opened_by_node IS DISTINCT FROM p_node
       OR p.opened_by_epoch IS DISTINCT FROM p_node_epoch
       OR p.open_leader_epoch IS DISTINCT FROM p_leader_epoch THEN
        RETURN QUERY SELECT 'not_leader'::text, -1::bigint;
        RETURN;
    END IF;
    IF p_offset < -1 OR p_offset > p.committed_end THEN
        RETURN QUERY SELECT 'offset_out_of_range'::text, p.log_start_offset;
        RETURN;
    END IF;
    RETURN QUERY SELECT NULL::text, mink_truncate_head(
        p_topic_id, p_partition, CASE WHEN p_offset = -1 THEN p.committed_end ELSE p_offset END);
END $$;


-- AlterConfigs / IncrementalAlterConfigs of a topic: compare-and-set on the config the
-- caller read (so two concurrent incremental changes never lose one), a change-log row so
-- every node's view carries the new settings. Returns 'ok', 'unknown_topic' or 'changed'
-- (the config moved meanwhile: read again and retry).
CREATE FUNCTION mink_alter_topic_config(p_name text, p_expected jsonb, p_config jsonb)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    t topics;
BEGIN
    SELECT * INTO t FROM topics WHERE name = p_name AND deleted_at IS NULL FOR UPDATE;
    IF NOT FOUND THEN
        RETURN 'unknown_topic';
    END IF;
    IF t.config IS DISTINCT FROM p_expected THEN
        RETURN 'changed';
    END IF;
    IF t.config = p_config THEN
        RETURN 'ok';
    END IF;
    UPDATE topics SET config = p_config WHERE topic_id = t.topic_id;
    PERFORM mink_log_change('topic_config_changed', jsonb_build_object(
        'topic_id', t.topic_id, 'name', t.name));
    RETURN 'ok';
END $$;


-- Collection, step 1: objects unreferenced for at least p_delay_ms go to objects_to_delete
-- (re-checked: an object an index row uses is never queued). At most p_limit per call.
CREATE FUNCTION mink_queue_unreferenced(p_delay_ms bigint, p_limit integer)
RETURNS SETOF text
LANGUAGE plpgsql AS $$
DECLARE
    v_keys text[];
BEGIN
    WITH due AS (
        DELETE FROM unreferenced_objects
         WHERE key IN (SELECT u.key FROM unreferenced_objects AS u
                        WHERE u.since <= now() - p_delay_ms * interval '1 millisecond'
                        ORDER BY u.since LIMIT p_limit FOR UPDATE SKIP LOCKED)
        RETURNING key
    )
    SELECT array_agg(key) INTO v_keys FROM due;
    IF v_keys IS NULL THEN
        RETURN;
    END IF;
    PERFORM mink_lock_object_keys(v_keys);
    RETURN QUERY
    INSERT INTO objects_to_delete (key, reason)
    SELECT k, 'unreferenced' FROM unnest(v_keys) AS k
     WHERE NOT EXISTS (SELECT 1 FROM batch_index AS b WHERE b.object_key = k)
    ON CONFLICT (key) DO NOTHING
    RETURNING objects_to_delete.key;
END $$;


-- Collection, step 3 (after the objects were deleted from the store): metadata rows that
-- describe nothing retained any more, at most p_limit of each kind per call.
--   wal_objects    rows of objects gone from the store, decided more than p_keep_s ago:
--                  CommitWal repeats of a key only come from the incarnation that wrote
--                  it, within its commit timeout; later ones carry a fenced node epoch.
--   change_log     versions older than the newest p_change_log_keep and than p_keep_s:
--                  nodes read the whole view at every refresh, so none depends on them.
--   producer_state producers idle for p_producer_expiration_ms (producer.id.expiration.ms).
--   leader_epochs  rows of partitions that no longer exist (deleted topics).
--   topic_stats    (cascades with topics; topics rows of deleted topics are kept: their
--                  ids must never be reused).
CREATE FUNCTION mink_prune_metadata(p_keep_s double precision, p_change_log_keep bigint,
                                    p_producer_expiration_ms bigint, p_limit integer)
RETURNS TABLE (kind text, deleted bigint)
LANGUAGE plpgsql AS $$
DECLARE
    v_count bigint;
BEGIN
    WITH gone AS (
        DELETE FROM wal_objects
         WHERE key IN (
            SELECT w.key FROM wal_objects AS w
             WHERE w.gc_queued_at IS NOT NULL
               AND w.gc_queued_at < now() - p_keep_s * interval '1 second'
               AND w.decided_at < now() - p_keep_s * interval '1 second'
               AND NOT EXISTS (SELECT 1 FROM objects_to_delete AS d WHERE d.key = w.key)
               AND NOT EXISTS (SELECT 1 FROM unreferenced_objects AS u WHERE u.key = w.key)
               AND NOT EXISTS (SELECT 1 FROM batch_index AS b WHERE b.object_key = w.key)
             ORDER BY w.gc_queued_at LIMIT p_limit)
        RETURNING 1)
    SELECT count(*) INTO v_count FROM gone;
    kind := 'wal_objects'; deleted := v_count; RETURN NEXT;

    WITH gone AS (
        DELETE FROM change_log
         WHERE version < (SELECT view_version FROM cluster) - p_change_log_keep
           AND at < now() - p_keep_s * interval '1 second'
           AND version IN (SELECT version FROM change_log ORDER BY version LIMIT p_limit)
        RETURNING 1)
    SELECT count(*) INTO v_count FROM gone;
    kind := 'change_log'; deleted := v_count; RETURN NEXT;

    WITH gone AS (
        DELETE FROM producer_state
         WHERE (topic_id, partition, producer_id) IN (
            SELECT s.topic_id, s.partition, s.producer_id FROM producer_state AS s
             WHERE s.updated_at < now() - p_producer_expiration_ms * interval '1 millisecond'
             ORDER BY s.updated_at LIMIT p_limit)
        RETURNING 1)
    SELECT count(*) INTO v_count FROM gone;
    kind := 'producer_state'; deleted := v_count; RETURN NEXT;

    WITH gone AS (
        DELETE FROM leader_epochs AS e
         WHERE NOT EXISTS (SELECT 1 FROM partitions AS p
                            WHERE p.topic_id = e.topic_id AND p.partition = e.partition)
        RETURNING 1)
    SELECT count(*) INTO v_count FROM gone;
    kind := 'leader_epochs'; deleted := v_count; RETURN NEXT;
END $$;
