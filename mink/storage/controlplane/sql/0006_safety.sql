-- Safety under PostgreSQL faults (issue 11).

-- No coordinator action runs unfenced: a missing coordinator epoch is an error, not "unchecked"
-- (a coordinator that lost its lease while it awaited passed NULL and moved partitions).
CREATE OR REPLACE FUNCTION mink_check_coordinator(p_coordinator_epoch bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_coordinator_epoch IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MK001', MESSAGE = 'missing_coordinator_epoch';
    END IF;
    PERFORM 1 FROM leases
     WHERE scope = 'coordinator' AND epoch = p_coordinator_epoch AND expires_at > now()
       FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MK001', MESSAGE = 'stale_coordinator_epoch';
    END IF;
END $$;

-- A leader re-leads its own partition at a fresh leader epoch (it restarted, or took over from a
-- fenced node that had opened it at this epoch). Not a coordinator action: fenced by the
-- caller's node epoch (current and live, FOR SHARE: no fence or registration can pass it while
-- this runs), by the partition being led by the caller, and by the leader epoch it expects.
CREATE FUNCTION mink_relead_own_partition(p_topic_id uuid, p_partition integer, p_node integer,
                                          p_node_epoch bigint, p_expected_leader_epoch integer)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    p partitions;
BEGIN
    IF p_node_epoch IS NULL OR p_expected_leader_epoch IS NULL THEN
        RAISE EXCEPTION USING ERRCODE = 'MK001', MESSAGE = 'missing_epoch';
    END IF;
    PERFORM 1 FROM nodes
     WHERE node_id = p_node AND epoch = p_node_epoch AND expires_at > now()
       FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MK001', MESSAGE = 'stale_node_epoch';
    END IF;
    SELECT * INTO p FROM partitions
     WHERE topic_id = p_topic_id AND partition = p_partition FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MK003',
            MESSAGE = format('unknown partition %s/%s', p_topic_id, p_partition);
    END IF;
    IF p.leader_node IS DISTINCT FROM p_node THEN
        RAISE EXCEPTION USING ERRCODE = 'MK002', MESSAGE = 'not_leader',
            DETAIL = jsonb_build_object('leader_node', p.leader_node,
                                        'leader_epoch', p.leader_epoch)::text;
    END IF;
    IF p.leader_epoch <> p_expected_leader_epoch THEN
        RAISE EXCEPTION USING ERRCODE = 'MK001', MESSAGE = 'leader_epoch_changed';
    END IF;

    UPDATE partitions SET leader_epoch = leader_epoch + 1
     WHERE topic_id = p_topic_id AND partition = p_partition
    RETURNING leader_epoch INTO p.leader_epoch;

    PERFORM mink_log_change('leader_changed', jsonb_build_object(
        'topic_id', p_topic_id, 'partition', p_partition, 'leader', p_node,
        'leader_epoch', p.leader_epoch, 'previous_leader', p_node));
    RETURN p.leader_epoch;
END $$;

-- OpenStream and the partition's producer states in one transaction, the states read after
-- the partition-row lock: a CommitWal of an earlier opener either committed before the lock
-- was granted (its batches and producer states are in what is returned) or runs after it and
-- is refused (not_open_by_node). Loading the states in a second transaction left a window in
-- which a late commit was in neither, and a retried batch was written twice.
CREATE FUNCTION mink_open_stream_with_producers(p_topic_id uuid, p_partition integer,
                                                p_leader_epoch integer, p_node integer,
                                                p_node_epoch bigint)
RETURNS TABLE (stream partitions, producers jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    p partitions;
BEGIN
    SELECT * INTO p FROM mink_open_stream(p_topic_id, p_partition, p_leader_epoch, p_node,
                                          p_node_epoch);
    RETURN QUERY SELECT p, coalesce((
        SELECT jsonb_agg(jsonb_build_array(s.producer_id, s.producer_epoch,
                                           encode(s.state, 'base64')) ORDER BY s.producer_id)
          FROM producer_state AS s
         WHERE s.topic_id = p_topic_id AND s.partition = p_partition), '[]'::jsonb);
END $$;

-- Node identity: each process has an incarnation id. A registration from another incarnation
-- of a node id whose row was renewed within p_guard_s seconds is refused (a second process
-- started with the id of a live node); the same incarnation registering again (after it
-- self-fenced) and a restart after a crash (the row not renewed for longer) are accepted.
ALTER TABLE nodes ADD COLUMN incarnation uuid, ADD COLUMN renewed_at timestamptz;

CREATE FUNCTION mink_register_incarnation(p_node integer, p_host text, p_port integer,
                                          p_rack text, p_ttl_s double precision,
                                          p_incarnation uuid, p_guard_s double precision)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    n nodes;
    v_epoch bigint;
BEGIN
    SELECT * INTO n FROM nodes WHERE node_id = p_node FOR UPDATE;
    IF FOUND AND n.incarnation IS DISTINCT FROM p_incarnation AND n.expires_at > now()
       AND n.renewed_at > now() - p_guard_s * interval '1 second' THEN
        RAISE EXCEPTION USING ERRCODE = 'MK008', MESSAGE = 'node_id_in_use',
            DETAIL = jsonb_build_object(
                'incarnation', n.incarnation, 'host', n.host, 'port', n.port,
                'renewed_s_ago', extract(epoch FROM now() - n.renewed_at))::text;
    END IF;
    v_epoch := mink_register_node(p_node, p_host, p_port, p_rack, p_ttl_s);
    UPDATE nodes SET incarnation = p_incarnation, renewed_at = now() WHERE node_id = p_node;
    RETURN v_epoch;
END $$;
