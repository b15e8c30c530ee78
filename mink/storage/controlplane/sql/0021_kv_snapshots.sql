-- KV tablet snapshots (seed 000's primary-key buckets; mink/storage/compaction/tablet.py):
-- the leader of a compacted partition writes its tablet to the object store every N records
-- or T seconds and references it here with the offset replay resumes from, under its leader
-- epoch. A new leader restores the newest one and replays the log from that offset. One row
-- per partition: the newest; the object it replaces is queued for deletion.

CREATE TABLE kv_snapshots (
    topic_id     uuid        NOT NULL,
    partition    integer     NOT NULL,
    leader_epoch integer     NOT NULL,   -- the epoch of the leader that wrote it
    log_offset   bigint      NOT NULL,   -- replay resumes here: the snapshot covers below it
    object_key   text        NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic_id, partition)
);


-- Reference a snapshot uploaded under p_object_key, fenced: p_node at p_node_epoch leads the
-- partition at p_leader_epoch (mink_check_group_coordinator, 0003). Returns 'stored', or
-- 'not_leader' / 'older' (a snapshot at the same or a later offset is there) and then the
-- upload is queued for deletion. The snapshot replaced is queued for deletion.
CREATE FUNCTION mink_put_kv_snapshot(p_topic_id uuid, p_partition integer,
                                     p_leader_epoch integer, p_node integer,
                                     p_node_epoch bigint, p_log_offset bigint,
                                     p_object_key text)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_old_key    text;
    v_old_offset bigint;
BEGIN
    IF NOT mink_check_group_coordinator(p_topic_id, p_partition, p_leader_epoch, p_node,
                                        p_node_epoch) THEN
        INSERT INTO objects_to_delete (key, reason) VALUES (p_object_key, 'kv_snapshot_refused')
        ON CONFLICT (key) DO NOTHING;
        RETURN 'not_leader';
    END IF;
    SELECT object_key, log_offset INTO v_old_key, v_old_offset FROM kv_snapshots
     WHERE topic_id = p_topic_id AND partition = p_partition FOR UPDATE;
    IF FOUND AND v_old_key = p_object_key THEN
        RETURN 'stored';  -- a repeat after a lost answer
    END IF;
    IF FOUND AND v_old_offset >= p_log_offset THEN
        INSERT INTO objects_to_delete (key, reason) VALUES (p_object_key, 'kv_snapshot_older')
        ON CONFLICT (key) DO NOTHING;
        RETURN 'older';
    END IF;
    INSERT INTO kv_snapshots AS s (topic_id, partition, leader_epoch, log_offset, object_key)
    VALUES (p_topic_id, p_partition, p_leader_epoch, p_log_offset, p_object_key)
    ON CONFLICT (topic_id, partition) DO UPDATE
        SET leader_epoch = excluded.leader_epoch, log_offset = excluded.log_offset,
            object_key = excluded.object_key, created_at = now();
    IF v_old_key IS NOT NULL THEN
        INSERT INTO objects_to_delete (key, reason) VALUES (v_old_key, 'kv_snapshot_replaced')
        ON CONFLICT (key) DO NOTHING;
    END IF;
    RETURN 'stored';
END $$;


-- Where each node's admin listener is, for lookups forwarded to a partition's leader
-- (mink/broker/admin/http.py). Written by the node once it has registered; read only by a
-- forwarding node (one indexed read per forwarded lookup), so not part of the view.
ALTER TABLE nodes ADD COLUMN admin_host text, ADD COLUMN admin_port integer;
