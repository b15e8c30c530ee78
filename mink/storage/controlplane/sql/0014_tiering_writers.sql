-- Tiering rounds handed to the topics' writer-lease holders (seed 001), so the rewrite spreads
-- over the nodes. The coordinator lease holder still schedules: each of its rounds plans
-- every partition's due WAL rows (mink/broker/cluster/tiering.py) and, for a topic whose
-- writer lease a live other node holds, records an assignment here instead of tiering it
-- itself; that node picks its assignments up and tiers those partitions. A topic with no
-- live writer-lease holder (its node died, the lease is not taken yet) is tiered by the
-- coordinator holder itself.
--
-- Every step of a round is then fenced twice: by the coordinator epoch (the schedule it
-- belongs to) and by the topic's writer lease epoch (who may rewrite the topic's index).
-- A round of the coordinator for a topic without a writer carries no writer epoch and is
-- refused once a writer lease of the topic is live: from then on that holder tiers it.
--
-- Lock order unchanged (0011): the upload's row, leases (FOR SHARE: the coordinator's, then
-- the writer's), partitions, object-key locks.

CREATE TABLE tiering_assignments (
    topic_id          uuid        NOT NULL,
    partition         integer     NOT NULL,
    holder            integer     NOT NULL,   -- the writer-lease holder asked to tier it
    writer_epoch      bigint      NOT NULL,   -- at this writer lease epoch
    coordinator_epoch bigint      NOT NULL,   -- scheduled under this coordinator epoch
    assigned_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic_id, partition)
);
CREATE INDEX tiering_assignments_holder ON tiering_assignments (holder);

ALTER TABLE stream_object_uploads ADD COLUMN writer_epoch bigint;


-- The writer fence of a tiering step: p_node holds the topic's writer lease at
-- p_writer_epoch now; or, p_writer_epoch NULL (a coordinator's round), nobody holds it.
CREATE FUNCTION mink_check_tiering_writer(p_topic_id uuid, p_node integer,
                                          p_writer_epoch bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_writer_epoch IS NULL THEN
        IF EXISTS (SELECT 1 FROM leases
                    WHERE scope = 'writer/' || p_topic_id::text AND expires_at > now()) THEN
            RAISE EXCEPTION USING ERRCODE = 'MK001', MESSAGE = 'writer_lease_held';
        END IF;
        RETURN;
    END IF;
    PERFORM 1 FROM leases
     WHERE scope = 'writer/' || p_topic_id::text AND holder = p_node
       AND epoch = p_writer_epoch AND expires_at > now()
       FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MK001', MESSAGE = 'stale_writer_lease_epoch';
    END IF;
END $$;


DROP FUNCTION mink_begin_stream_object(bigint, text, uuid, integer, bigint, bigint);

-- Before an upload: record it, under the coordinator epoch and the writer fence. Safe to
-- repeat.
CREATE FUNCTION mink_begin_stream_object(p_coordinator_epoch bigint, p_node integer,
                                         p_writer_epoch bigint, p_key text,
                                         p_topic_id uuid, p_partition integer,
                                         p_base_offset bigint, p_last_offset bigint)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM mink_check_coordinator(p_coordinator_epoch);
    PERFORM mink_check_tiering_writer(p_topic_id, p_node, p_writer_epoch);
    INSERT INTO stream_object_uploads (key, topic_id, partition, base_offset, last_offset,
                                       coordinator_epoch, writer_epoch)
    VALUES (p_key, p_topic_id, p_partition, p_base_offset, p_last_offset, p_coordinator_epoch,
            p_writer_epoch)
    ON CONFLICT (key) DO NOTHING;  -- a repeat after a lost answer
END $$;


-- The swap of 0011 behind both fences: a stale coordinator epoch or writer lease epoch
-- raises MK001 and changes nothing (the upload's row stays and is swept; the current holder
-- tiers the range again). A repeat of a swap that was done still answers 'swapped'.
CREATE FUNCTION mink_swap_stream_object_fenced(p_coordinator_epoch bigint, p_node integer,
                                               p_writer_epoch bigint, p_key text,
                                               p_topic_id uuid, p_partition integer,
                                               p_base_offset bigint, p_last_offset bigint,
                                               p_data_length bigint, p_rows jsonb)
RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM batch_index WHERE object_key = p_key) THEN
        RETURN 'swapped';
    END IF;
    PERFORM mink_check_coordinator(p_coordinator_epoch);
    PERFORM mink_check_tiering_writer(p_topic_id, p_node, p_writer_epoch);
    RETURN mink_swap_stream_object(p_coordinator_epoch, p_key, p_topic_id, p_partition,
                                   p_base_offset, p_last_offset, p_data_length, p_rows);
END $$;


-- The coordinator's schedule: each {"topic_id", "partition", "holder", "writer_epoch"} is
-- (re)assigned under p_coordinator_epoch; assignments whose holder no longer holds the
-- topic's writer lease at their epoch are dropped (that topic goes back to the coordinator
-- or to the new holder at the next round). Returns how many were assigned.
CREATE FUNCTION mink_assign_tiering(p_coordinator_epoch bigint, p_assignments jsonb)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_count integer;
BEGIN
    PERFORM mink_check_coordinator(p_coordinator_epoch);
    DELETE FROM tiering_assignments AS a
     WHERE NOT EXISTS (SELECT 1 FROM leases AS l
                        WHERE l.scope = 'writer/' || a.topic_id::text AND l.holder = a.holder
                          AND l.epoch = a.writer_epoch AND l.expires_at > now());
    INSERT INTO tiering_assignments AS a (topic_id, partition, holder, writer_epoch,
                                          coordinator_epoch)
    SELECT r.topic_id, r.partition, r.holder, r.writer_epoch, p_coordinator_epoch
      FROM jsonb_to_recordset(p_assignments)
           AS r(topic_id uuid, partition integer, holder integer, writer_epoch bigint)
    ON CONFLICT (topic_id, partition) DO UPDATE
        SET holder = excluded.holder, writer_epoch = excluded.writer_epoch,
            coordinator_epoch = excluded.coordinator_epoch, assigned_at = now();
    GET DIAGNOSTICS v_count = ROW_COUNT;
    RETURN v_count;
END $$;
