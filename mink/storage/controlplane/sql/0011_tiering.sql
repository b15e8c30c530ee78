-- Tiering (seed 000's tiering worker): committed WAL data of one partition is rewritten into
-- a stream object (mink/storage/stream_object.py), and the exact index rows it covers are
-- swapped for one row in one transaction, fenced by the coordinator lease epoch. A WAL object
-- whose last row is swapped is released (batch_index_released, 0008) and collected after
-- file.delete.delay.ms like any other unreferenced object.
--
-- Lock order (as in 0002 and 0008): the stream upload's row, leases (the coordinator lease,
-- FOR SHARE), partitions (one row), object-key advisory locks of the WAL keys that lost their
-- last row (old committed keys: no CommitWal of them can hold a partition lock).
--
-- A round never writes partitions: the committed end, the log start and max_timestamp stay
-- the leader's and retention's. It holds the partition's row lock only for the swap itself
-- (one DELETE of the covered rows, one INSERT), so the leader's commits wait at most that.


-- Stream objects being written: recorded (fenced) before the upload starts, removed by the
-- swap that indexes the object or refuses it. A row left behind (a tiering node killed, a
-- round refused with an error) is swept after a timeout and its object queued for deletion,
-- so an upload never leaks; a swap whose row was swept is refused, so a swept object is never
-- indexed.
CREATE TABLE stream_object_uploads (
    key               text        PRIMARY KEY,
    topic_id          uuid        NOT NULL,
    partition         integer     NOT NULL,
    base_offset       bigint      NOT NULL,
    last_offset       bigint      NOT NULL,
    coordinator_epoch bigint      NOT NULL,
    started_at        timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX stream_object_uploads_started ON stream_object_uploads (started_at);

-- The rows still pointing into WAL objects: what tiering has left to do.
CREATE INDEX batch_index_wal_rows ON batch_index (topic_id, partition, base_offset)
    WHERE object_key LIKE 'wal/%';


-- Before an upload: record it, under the coordinator epoch. Safe to repeat.
CREATE FUNCTION mink_begin_stream_object(p_coordinator_epoch bigint, p_key text,
                                         p_topic_id uuid, p_partition integer,
                                         p_base_offset bigint, p_last_offset bigint)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM mink_check_coordinator(p_coordinator_epoch);
    INSERT INTO stream_object_uploads (key, topic_id, partition, base_offset, last_offset,
                                       coordinator_epoch)
    VALUES (p_key, p_topic_id, p_partition, p_base_offset, p_last_offset, p_coordinator_epoch)
    ON CONFLICT (key) DO NOTHING;  -- a repeat after a lost answer
END $$;


-- The swap. p_rows: the index rows the object covers, exactly as the round read them
-- ([{"base_offset", "last_offset", "object_key", "byte_start", "byte_end"}, ...]), in offset
-- order and contiguous from p_base_offset to p_last_offset; p_data_length: the bytes of the
-- object's batches (= the sum of the rows' ranges: the bytes are the same).
-- Returns 'swapped' (also to a repeat of a swap that was done), or why not (nothing changed in the index; the upload is queued for
-- deletion in this transaction):
--   unknown_upload     no begin for this key (or it was swept: the round took too long)
--   unknown_partition  the partition is gone (its topic was deleted)
--   index_changed      the rows are not all there as read (retention, DeleteRecords)
--   invalid_rows       the rows are not contiguous or their bytes are not p_data_length
-- A stale or missing coordinator epoch raises MK001 and changes nothing (the upload's row
-- stays and is swept; the new holder tiers the range again).
CREATE FUNCTION mink_swap_stream_object(p_coordinator_epoch bigint, p_key text,
                                        p_topic_id uuid, p_partition integer,
                                        p_base_offset bigint, p_last_offset bigint,
                                        p_data_length bigint, p_rows jsonb)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_rows     integer := jsonb_array_length(p_rows);
    v_status   text;
    v_found    integer;
    v_count    integer;
    v_max_ts   bigint;
    v_run_ts   bigint;
    v_batches  bigint;
BEGIN
    -- A repeat of a swap whose answer was lost: it is done.
    IF EXISTS (SELECT 1 FROM batch_index WHERE object_key = p_key) THEN
        RETURN 'swapped';
    END IF;
    PERFORM mink_check_coordinator(p_coordinator_epoch);
    DELETE FROM stream_object_uploads
     WHERE key = p_key AND topic_id = p_topic_id AND partition = p_partition
       AND base_offset = p_base_offset AND last_offset = p_last_offset;
    IF NOT FOUND THEN
        v_status := 'unknown_upload';
    END IF;

    IF v_status IS NULL THEN
        -- Contiguous, in order, from base to last, and the bytes add up.
        IF v_rows = 0 OR EXISTS (
            SELECT 1 FROM (
                SELECT (e->>'base_offset')::bigint AS base_offset,
                       (e->>'last_offset')::bigint AS last_offset,
                       (e->>'byte_start')::bigint AS byte_start,
                       (e->>'byte_end')::bigint AS byte_end,
                       lag((e->>'last_offset')::bigint) OVER (ORDER BY n) AS previous_last
                  FROM jsonb_array_elements(p_rows) WITH ORDINALITY AS r(e, n)) AS x
             WHERE x.last_offset < x.base_offset OR x.byte_end < x.byte_start
                OR (x.previous_last IS NULL AND x.base_offset <> p_base_offset)
                OR (x.previous_last IS NOT NULL AND x.base_offset <> x.previous_last + 1))
           OR (SELECT max(r.last_offset) <> p_last_offset
                      OR sum(r.byte_end - r.byte_start) <> p_data_length
                 FROM jsonb_to_recordset(p_rows)
                      AS r(last_offset bigint, byte_start bigint, byte_end bigint)) THEN
            v_status := 'invalid_rows';
        END IF;
    END IF;

    IF v_status IS NULL THEN
        -- The partition's row lock: retention, DeleteRecords and a topic deletion take it
        -- before they delete index rows, so the rows counted here stay until the commit.
        PERFORM 1 FROM partitions
         WHERE topic_id = p_topic_id AND partition = p_partition FOR UPDATE;
        IF NOT FOUND THEN
            v_status := 'unknown_partition';
        END IF;
    END IF;

    IF v_status IS NULL THEN
        SELECT count(*) INTO v_found
          FROM batch_index AS b
          JOIN jsonb_to_recordset(p_rows)
               AS r(base_offset bigint, last_offset bigint, object_key text,
                    byte_start bigint, byte_end bigint)
            ON b.base_offset = r.base_offset AND b.last_offset = r.last_offset
           AND b.object_key = r.object_key AND b.byte_start = r.byte_start
           AND b.byte_end = r.byte_end
         WHERE b.topic_id = p_topic_id AND b.partition = p_partition;
        IF v_found <> v_rows THEN
            v_status := 'index_changed';
        END IF;
    END IF;

    IF v_status IS NOT NULL THEN
        INSERT INTO objects_to_delete (key, reason)
        SELECT p_key, 'tiering_' || v_status
         WHERE NOT EXISTS (SELECT 1 FROM batch_index WHERE object_key = p_key)
        ON CONFLICT (key) DO NOTHING;
        RETURN v_status;
    END IF;

    -- (the WAL objects whose last row goes are released by batch_index_released; the
    -- partition's statistics lose the rows and keep the bytes through its stats triggers)
    WITH gone AS (
        DELETE FROM batch_index
         WHERE topic_id = p_topic_id AND partition = p_partition
           AND base_offset BETWEEN p_base_offset AND p_last_offset
        RETURNING max_timestamp, running_max_timestamp, batch_count)
    SELECT count(*), max(max_timestamp), max(running_max_timestamp), sum(batch_count)
      INTO v_count, v_max_ts, v_run_ts, v_batches FROM gone;
    IF v_count <> v_rows THEN  -- cannot happen under the row lock; never swap a guess
        RAISE EXCEPTION 'tiering swap of % found % rows, expected %', p_key, v_count, v_rows;
    END IF;
    INSERT INTO batch_index (topic_id, partition, base_offset, last_offset, object_key,
                             byte_start, byte_end, max_timestamp, batch_count,
                             running_max_timestamp)
    VALUES (p_topic_id, p_partition, p_base_offset, p_last_offset, p_key, 0, p_data_length,
            v_max_ts, v_batches, v_run_ts);
    RETURN 'swapped';
END $$;


-- Uploads begun more than p_age_s ago and never swapped (their round died or was refused
-- with an error): forgotten, their objects queued for deletion. Under the coordinator epoch.
-- Returns the keys queued.
CREATE FUNCTION mink_sweep_stream_uploads(p_coordinator_epoch bigint, p_age_s double precision)
RETURNS SETOF text
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM mink_check_coordinator(p_coordinator_epoch);
    RETURN QUERY
    WITH swept AS (
        DELETE FROM stream_object_uploads
         WHERE started_at < now() - p_age_s * interval '1 second'
        RETURNING key
    ), queued AS (
        INSERT INTO objects_to_delete (key, reason)
        SELECT s.key, 'tiering_abandoned' FROM swept AS s
         WHERE NOT EXISTS (SELECT 1 FROM batch_index AS b WHERE b.object_key = s.key)
        ON CONFLICT (key) DO NOTHING
        RETURNING objects_to_delete.key
    )
    SELECT q.key FROM queued AS q;
END $$;
