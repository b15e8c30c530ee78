-- The swap no longer takes the partition's row lock (0011 took it FOR UPDATE from its index
-- check to its commit). A WAL commit locks the rows of every partition in its object, so one
-- swap of one partition held up the whole node's commits for the swap's DELETE, its
-- triggers (objects released, statistics) and its INSERT: 65-150 ms each, a p99 of commit
-- latency twice the one without tiering (benchmarks/tiering.py --mode commit-latency).
-- The swap now locks exactly the index rows it replaces (FOR UPDATE, in offset order).
-- Whoever else deletes index rows (retention's head truncation, DeleteRecords, a topic
-- deletion) deletes those rows too, so it either waits for the swap and finds them gone
-- (the stream object's row is left for the next pass, which deletes the rows wholly below
-- the log start), or deletes them first, and the swap's count finds them missing
-- (index_changed). A commit only inserts rows above the committed end, which no swap covers.
--
-- Nor does it update the partition's statistics row (partition_stats, 0009) from its
-- triggers, twice (its DELETE's, then its INSERT's: the second update of a row this
-- transaction wrote re-checks its foreign key, FOR KEY SHARE on the partition's row, which a
-- commit's FOR UPDATE waits for). The triggers skip a statement while `mink.stats_by_caller`
-- is set, and the swap updates the row once, last, by the net change (the bytes stay, the
-- rows go from n to 1): a commit of the same partition waits only for the swap's commit.
--
-- Lock order: the upload's row, leases (FOR SHARE), the covered index rows (in offset order),
-- object-key locks of the WAL keys that lost their last row (old committed keys: no commit
-- holds them), the partition's statistics row. A commit takes its new object's key, the
-- partitions it writes, then their statistics rows: no cycle.

CREATE OR REPLACE FUNCTION mink_batch_index_added() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('mink.stats_by_caller', true) = 'on' THEN
        RETURN NULL;
    END IF;
    UPDATE partition_stats AS s
       SET indexed_bytes = s.indexed_bytes + g.bytes, index_rows = s.index_rows + g.rows
      FROM (SELECT n.topic_id, n.partition, sum(n.byte_end - n.byte_start) AS bytes,
                   count(*) AS rows
              FROM new_rows AS n GROUP BY n.topic_id, n.partition) AS g
     WHERE s.topic_id = g.topic_id AND s.partition = g.partition;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION mink_batch_index_removed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('mink.stats_by_caller', true) = 'on' THEN
        RETURN NULL;
    END IF;
    UPDATE partition_stats AS s
       SET indexed_bytes = s.indexed_bytes - g.bytes, index_rows = s.index_rows - g.rows
      FROM (SELECT o.topic_id, o.partition, sum(o.byte_end - o.byte_start) AS bytes,
                   count(*) AS rows
              FROM gone_rows AS o GROUP BY o.topic_id, o.partition) AS g
     WHERE s.topic_id = g.topic_id AND s.partition = g.partition;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION mink_swap_stream_object(p_coordinator_epoch bigint, p_key text,
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
        -- No lock on the partition's row (a WAL commit of every partition in the object
        -- takes it): the covered index rows' own locks keep them until the commit.
        -- Retention, DeleteRecords and a topic deletion delete index rows, so they wait for
        -- these locks (and then find the rows gone), or hold them first (and the count
        -- below finds rows missing: index_changed).
        IF NOT EXISTS (SELECT 1 FROM partitions
                        WHERE topic_id = p_topic_id AND partition = p_partition) THEN
            v_status := 'unknown_partition';
        ELSE
            PERFORM 1 FROM batch_index
             WHERE topic_id = p_topic_id AND partition = p_partition
               AND base_offset BETWEEN p_base_offset AND p_last_offset
             ORDER BY base_offset FOR UPDATE;
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
    -- statistics are updated once, below)
    PERFORM set_config('mink.stats_by_caller', 'on', true);
    WITH gone AS (
        DELETE FROM batch_index
         WHERE topic_id = p_topic_id AND partition = p_partition
           AND base_offset BETWEEN p_base_offset AND p_last_offset
        RETURNING max_timestamp, running_max_timestamp, batch_count)
    SELECT count(*), max(max_timestamp), max(running_max_timestamp), sum(batch_count)
      INTO v_count, v_max_ts, v_run_ts, v_batches FROM gone;
    IF v_count <> v_rows THEN  -- cannot happen under the rows' locks; never swap a guess
        RAISE EXCEPTION 'tiering swap of % found % rows, expected %', p_key, v_count, v_rows;
    END IF;
    INSERT INTO batch_index (topic_id, partition, base_offset, last_offset, object_key,
                             byte_start, byte_end, max_timestamp, batch_count,
                             running_max_timestamp)
    VALUES (p_topic_id, p_partition, p_base_offset, p_last_offset, p_key, 0, p_data_length,
            v_max_ts, v_batches, v_run_ts);
    PERFORM set_config('mink.stats_by_caller', '', true);
    UPDATE partition_stats SET index_rows = index_rows - (v_rows - 1)
     WHERE topic_id = p_topic_id AND partition = p_partition;
    RETURN 'swapped';
END $$;
