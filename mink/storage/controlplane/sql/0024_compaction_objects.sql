-- A compaction pass writes several objects (docs/compaction.md): the cleaned range is
-- streamed into stream objects of at most tiering_stream_object_bytes each, so a pass's
-- memory does not grow with the partition (mink/storage/compaction/store.py). This swaps
-- the exact rows the pass read for all of its objects' rows in one transaction fenced by
-- the writer lease epoch, as mink_swap_compacted (0020) does for one object; that function
-- stays for a pass of an older node during an upgrade.
--
-- Lock order as 0020's: the uploads' rows, the writer lease (FOR SHARE), the covered index
-- rows (offset order), object-key locks of the objects that lost their last row
-- (batch_index_released), the partition's statistics row (its triggers), then
-- compaction_state.


-- p_objects: the new objects in offset order, [{"key", "base_offset", "last_offset",
-- "data_length", "batches", "max_timestamp"}], each begun by mink_begin_compaction (0020)
-- with its own offsets; together they cover [p_base_offset, p_last_offset] without a gap
-- or an overlap (gaps inside an object are the records compacted away). p_rows, p_cleaned_to
-- and p_tombstone_horizon as mink_swap_compacted's.
-- Returns 'swapped' (also to a repeat of a swap that was done), or why not (every upload
-- is queued for deletion, nothing else changes): unknown_upload, unknown_partition,
-- index_changed, as 0020. A stale writer lease epoch raises MK001 and changes nothing.
CREATE FUNCTION mink_swap_compacted_objects(p_node integer, p_writer_epoch bigint,
                                            p_topic_id uuid, p_partition integer,
                                            p_base_offset bigint, p_last_offset bigint,
                                            p_objects jsonb, p_cleaned_to bigint,
                                            p_tombstone_horizon bigint, p_rows jsonb)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_rows    integer := jsonb_array_length(p_rows);
    v_objects integer := jsonb_array_length(p_objects);
    v_keys    text[];
    v_status  text;
    v_found   integer;
    v_in      integer;
    v_count   integer;
    v_prev_ts bigint;
BEGIN
    SELECT array_agg(o.key ORDER BY o.base_offset) INTO v_keys
      FROM jsonb_to_recordset(p_objects) AS o(key text, base_offset bigint);
    IF EXISTS (SELECT 1 FROM batch_index WHERE object_key = ANY (v_keys)) THEN
        RETURN 'swapped';
    END IF;
    IF p_writer_epoch IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MK001', MESSAGE = 'stale_writer_lease_epoch';
    END IF;
    PERFORM mink_check_tiering_writer(p_topic_id, p_node, p_writer_epoch);
    -- the objects tile the range: never swap a guess
    IF v_objects < 1 OR EXISTS (
        SELECT 1 FROM (
            SELECT base_offset, last_offset,
                   lag(last_offset) OVER (ORDER BY base_offset) AS prev_last,
                   row_number() OVER (ORDER BY base_offset) AS n
              FROM jsonb_to_recordset(p_objects) AS o(base_offset bigint, last_offset bigint)
        ) AS t
         WHERE last_offset < base_offset
            OR (n = 1 AND base_offset <> p_base_offset)
            OR (n > 1 AND base_offset <> prev_last + 1)
            OR (n = v_objects AND last_offset <> p_last_offset)) THEN
        RAISE EXCEPTION 'compaction objects % do not tile [%, %]', p_objects, p_base_offset,
            p_last_offset;
    END IF;

    WITH gone AS (
        DELETE FROM stream_object_uploads AS u
         USING jsonb_to_recordset(p_objects)
               AS o(key text, base_offset bigint, last_offset bigint)
         WHERE u.key = o.key AND u.topic_id = p_topic_id AND u.partition = p_partition
           AND u.base_offset = o.base_offset AND u.last_offset = o.last_offset
        RETURNING u.key)
    SELECT count(*) INTO v_found FROM gone;
    IF v_found <> v_objects THEN
        v_status := 'unknown_upload';
    END IF;

    IF v_status IS NULL THEN
        IF NOT EXISTS (SELECT 1 FROM partitions
                        WHERE topic_id = p_topic_id AND partition = p_partition) THEN
            v_status := 'unknown_partition';
        ELSE
            PERFORM 1 FROM batch_index
             WHERE topic_id = p_topic_id AND partition = p_partition
               AND last_offset >= p_base_offset AND base_offset <= p_last_offset
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
        SELECT count(*) INTO v_in FROM batch_index
         WHERE topic_id = p_topic_id AND partition = p_partition
           AND last_offset >= p_base_offset AND base_offset <= p_last_offset;
        IF v_found <> v_rows OR v_in <> v_rows THEN
            v_status := 'index_changed';
        END IF;
    END IF;

    IF v_status IS NOT NULL THEN
        DELETE FROM stream_object_uploads WHERE key = ANY (v_keys);
        INSERT INTO objects_to_delete (key, reason)
        SELECT k, 'compaction_' || v_status FROM unnest(v_keys) AS k
         WHERE NOT EXISTS (SELECT 1 FROM batch_index WHERE object_key = k)
        ON CONFLICT (key) DO NOTHING;
        RETURN v_status;
    END IF;

    -- The running max timestamp of the new rows: of what they hold (compaction only
    -- removes records), on top of the rows before the range, so it still grows with the
    -- offset.
    SELECT running_max_timestamp INTO v_prev_ts FROM batch_index
     WHERE topic_id = p_topic_id AND partition = p_partition AND last_offset < p_base_offset
     ORDER BY base_offset DESC LIMIT 1;
    -- (the objects whose last row goes are released by batch_index_released and collected
    -- after file.delete.delay.ms; the statistics triggers count the bytes that went)
    DELETE FROM batch_index
     WHERE topic_id = p_topic_id AND partition = p_partition
       AND base_offset BETWEEN p_base_offset AND p_last_offset;
    GET DIAGNOSTICS v_count = ROW_COUNT;
    IF v_count <> v_rows THEN  -- cannot happen under the rows' locks; never swap a guess
        RAISE EXCEPTION 'compaction swap of % found % rows, expected %', v_keys, v_count,
            v_rows;
    END IF;
    INSERT INTO batch_index (topic_id, partition, base_offset, last_offset, object_key,
                             byte_start, byte_end, max_timestamp, batch_count,
                             running_max_timestamp)
    SELECT p_topic_id, p_partition, o.base_offset, o.last_offset, o.key, 0, o.data_length,
           o.max_timestamp, o.batches,
           greatest(coalesce(v_prev_ts, -1),
                    max(o.max_timestamp) OVER (ORDER BY o.base_offset))
      FROM jsonb_to_recordset(p_objects)
           AS o(key text, base_offset bigint, last_offset bigint, data_length bigint,
                batches integer, max_timestamp bigint);
    INSERT INTO compaction_state AS s (topic_id, partition, cleaned_to, tombstone_horizon,
                                       passes)
    VALUES (p_topic_id, p_partition, p_cleaned_to, p_tombstone_horizon, 1)
    ON CONFLICT (topic_id, partition) DO UPDATE
        SET cleaned_to = greatest(s.cleaned_to, excluded.cleaned_to),
            tombstone_horizon = excluded.tombstone_horizon, passes = s.passes + 1,
            cleaned_at = now();
    RETURN 'swapped';
END $$;
