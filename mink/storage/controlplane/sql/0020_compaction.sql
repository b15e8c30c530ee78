-- Compaction of cleanup.policy=compact topics (Kafka's LogCleaner; docs/compaction.md): the
-- writer-lease holder of a topic rewrites a partition's tiered index rows, from the log
-- start up to the cleanable end, into one stream object holding the latest record per key
-- at its offset (mink/storage/compaction/store.py), and swaps the exact rows it read for
-- that object's row in one transaction fenced by its writer lease epoch.
--
-- Lock order as the tiering swap's (0016): the upload's row, the writer lease (FOR SHARE),
-- the covered index rows (offset order), object-key locks of the objects that lost their
-- last row (batch_index_released), the partition's statistics row (its triggers), then
-- this file's compaction_state row (nobody else locks it). No lock on the partition's row:
-- a commit only inserts rows above the committed end, which no pass covers.


-- Kafka's cleaner checkpoint: per partition, the offset below which it is compacted (the
-- first dirty offset), and when a pass last swapped. No foreign key: its check would take
-- the partition's row FOR KEY SHARE inside the swap, which a commit's FOR UPDATE waits for.
-- A row of a deleted partition is harmless (nothing reads it without the partition).
CREATE TABLE compaction_state (
    topic_id    uuid        NOT NULL,
    partition   integer     NOT NULL,
    cleaned_to  bigint      NOT NULL,
    -- KIP-534: the earliest delete horizon (ms) of the tombstones the last pass kept; a pass
    -- is due then even with nothing dirty, to drop them. NULL: none waits.
    tombstone_horizon bigint,
    passes      bigint      NOT NULL DEFAULT 0,
    cleaned_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic_id, partition)
);


-- Before the upload: record it (stream_object_uploads, 0011), under the writer lease.
-- coordinator_epoch 0: no coordinator round (the sweep goes by started_at only). Safe to
-- repeat.
CREATE FUNCTION mink_begin_compaction(p_node integer, p_writer_epoch bigint, p_key text,
                                      p_topic_id uuid, p_partition integer,
                                      p_base_offset bigint, p_last_offset bigint)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_writer_epoch IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MK001', MESSAGE = 'stale_writer_lease_epoch';
    END IF;
    PERFORM mink_check_tiering_writer(p_topic_id, p_node, p_writer_epoch);
    INSERT INTO stream_object_uploads (key, topic_id, partition, base_offset, last_offset,
                                       coordinator_epoch, writer_epoch)
    VALUES (p_key, p_topic_id, p_partition, p_base_offset, p_last_offset, 0, p_writer_epoch)
    ON CONFLICT (key) DO NOTHING;
END $$;


-- The swap. p_rows: every index row of [p_base_offset, p_last_offset] exactly as the pass
-- read them ({"base_offset", "last_offset", "object_key", "byte_start", "byte_end"}), all
-- of them stream-object rows; the new row covers the same offsets (gaps inside are the
-- records compacted away) with p_data_length bytes, p_batches batches and p_max_timestamp.
-- p_cleaned_to: the partition's new first dirty offset; p_tombstone_horizon: the earliest
-- delete horizon of the tombstones kept (NULL: none).
-- Returns 'swapped' (also to a repeat of a swap that was done), or why not (the upload is
-- queued for deletion, nothing else changes):
--   unknown_upload     no begin for this key (or the sweep took it: the pass was too slow)
--   unknown_partition  the partition is gone
--   index_changed      the rows of the range are not exactly those read (retention,
--                      DeleteRecords, tiering or another pass meanwhile)
-- A stale writer lease epoch raises MK001 and changes nothing.
CREATE FUNCTION mink_swap_compacted(p_node integer, p_writer_epoch bigint, p_key text,
                                    p_topic_id uuid, p_partition integer,
                                    p_base_offset bigint, p_last_offset bigint,
                                    p_data_length bigint, p_batches integer,
                                    p_max_timestamp bigint, p_cleaned_to bigint,
                                    p_tombstone_horizon bigint, p_rows jsonb)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_rows    integer := jsonb_array_length(p_rows);
    v_status  text;
    v_found   integer;
    v_in      integer;
    v_count   integer;
    v_run_ts  bigint;
BEGIN
    IF EXISTS (SELECT 1 FROM batch_index WHERE object_key = p_key) THEN
        RETURN 'swapped';
    END IF;
    IF p_writer_epoch IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MK001', MESSAGE = 'stale_writer_lease_epoch';
    END IF;
    PERFORM mink_check_tiering_writer(p_topic_id, p_node, p_writer_epoch);
    DELETE FROM stream_object_uploads
     WHERE key = p_key AND topic_id = p_topic_id AND partition = p_partition
       AND base_offset = p_base_offset AND last_offset = p_last_offset;
    IF NOT FOUND THEN
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
        INSERT INTO objects_to_delete (key, reason)
        SELECT p_key, 'compaction_' || v_status
         WHERE NOT EXISTS (SELECT 1 FROM batch_index WHERE object_key = p_key)
        ON CONFLICT (key) DO NOTHING;
        RETURN v_status;
    END IF;

    -- (the objects whose last row goes are released by batch_index_released and collected
    -- after file.delete.delay.ms; the statistics triggers count the bytes that went)
    WITH gone AS (
        DELETE FROM batch_index
         WHERE topic_id = p_topic_id AND partition = p_partition
           AND base_offset BETWEEN p_base_offset AND p_last_offset
        RETURNING running_max_timestamp)
    SELECT count(*), max(running_max_timestamp) INTO v_count, v_run_ts FROM gone;
    IF v_count <> v_rows THEN  -- cannot happen under the rows' locks; never swap a guess
        RAISE EXCEPTION 'compaction swap of % found % rows, expected %', p_key, v_count, v_rows;
    END IF;
    INSERT INTO batch_index (topic_id, partition, base_offset, last_offset, object_key,
                             byte_start, byte_end, max_timestamp, batch_count,
                             running_max_timestamp)
    VALUES (p_topic_id, p_partition, p_base_offset, p_last_offset, p_key, 0, p_data_length,
            p_max_timestamp, p_batches, v_run_ts);
    INSERT INTO compaction_state AS s (topic_id, partition, cleaned_to, tombstone_horizon,
                                       passes)
    VALUES (p_topic_id, p_partition, p_cleaned_to, p_tombstone_horizon, 1)
    ON CONFLICT (topic_id, partition) DO UPDATE
        SET cleaned_to = greatest(s.cleaned_to, excluded.cleaned_to),
            tombstone_horizon = excluded.tombstone_horizon, passes = s.passes + 1,
            cleaned_at = now();
    RETURN 'swapped';
END $$;
