-- A deleted topic leaves nothing of its compacted partitions behind (a month of creating and
-- deleting compacted topics must not grow the database or the object store): when its
-- partitions' rows go (mink_delete_topic, 0002), their KV tablet snapshots are queued for
-- deletion and their rows go with the cleaner's checkpoints. A leader still writing a
-- snapshot finds no partition at its fence (mink_put_kv_snapshot) and queues its own upload.
-- One call per statement (transition table), as batch_index_released.

CREATE FUNCTION mink_partitions_deleted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    WITH gone AS (
        DELETE FROM kv_snapshots AS s
         USING gone_partitions AS g
         WHERE s.topic_id = g.topic_id AND s.partition = g.partition
        RETURNING s.object_key)
    INSERT INTO objects_to_delete (key, reason)
    SELECT object_key, 'kv_snapshot_topic_deleted' FROM gone
    ON CONFLICT (key) DO NOTHING;
    DELETE FROM compaction_state AS c
     USING gone_partitions AS g
     WHERE c.topic_id = g.topic_id AND c.partition = g.partition;
    RETURN NULL;
END $$;

CREATE TRIGGER partitions_deleted AFTER DELETE ON partitions
    REFERENCING OLD TABLE AS gone_partitions
    FOR EACH STATEMENT EXECUTE FUNCTION mink_partitions_deleted();
