-- Mink metadata operations: the epoch-fenced writes, as SQL functions.
--
-- Each operation is one function call, i.e. one statement and one transaction, that checks
-- the epochs it is given. Refusals are raised with these SQLSTATEs (MESSAGE = the reason):
--   MK001  stale epoch      stale_node_epoch, stale_coordinator_epoch, leader_epoch_changed
--   MK002  not leader       not_leader, stale_leader_epoch, unknown_leader_epoch;
--                           DETAIL = {"leader_node": .., "leader_epoch": ..}
--   MK003  unknown topic or partition
--   MK004  topic exists
--   MK005  invalid partitions
--   MK006  unknown node
--   MK007  node is live (fence refused)
--
-- Locks are always taken in this order, so no two operations deadlock: object-key advisory
-- locks, nodes, leases, topics, partitions (ordered by topic_id, partition), and the `cluster`
-- row (the change-log version) last of all. Checks come before the version is taken, so a
-- refused operation never uses up a version.


-- The change log -----------------------------------------------------------------------------

-- Append a change: the next view version, the row, and a NOTIFY (sent at commit; a wake-up
-- only, listeners read change_log). The row lock on `cluster` is held until commit, so
-- change-log writers commit in version order and a reader of `version > last` misses nothing.
CREATE FUNCTION mink_log_change(p_kind text, p_body jsonb) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_version bigint;
BEGIN
    UPDATE cluster SET view_version = view_version + 1 RETURNING view_version INTO v_version;
    INSERT INTO change_log (version, kind, body) VALUES (v_version, p_kind, p_body);
    PERFORM pg_notify('mink_view', v_version::text);
    RETURN v_version;
END $$;

-- Coordinator actions carry the coordinator lease epoch (NULL: unchecked, e.g. tools/tests).
-- FOR SHARE: nobody can take the lease over while the action runs.
CREATE FUNCTION mink_check_coordinator(p_coordinator_epoch bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_coordinator_epoch IS NULL THEN
        RETURN;
    END IF;
    PERFORM 1 FROM leases
     WHERE scope = 'coordinator' AND epoch = p_coordinator_epoch AND expires_at > now()
       FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MK001', MESSAGE = 'stale_coordinator_epoch';
    END IF;
END $$;


-- Membership ---------------------------------------------------------------------------------

-- RegisterNode: epoch + 1 (1 for a new node). Leases of earlier incarnations become void.
CREATE FUNCTION mink_register_node(p_node integer, p_host text, p_port integer, p_rack text,
                                   p_ttl_s double precision) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_epoch bigint;
BEGIN
    INSERT INTO nodes AS n (node_id, epoch, host, port, rack, registered_at, expires_at)
    VALUES (p_node, 1, p_host, p_port, p_rack, now(), now() + p_ttl_s * interval '1 second')
    ON CONFLICT (node_id) DO UPDATE
        SET epoch = n.epoch + 1, host = excluded.host, port = excluded.port,
            rack = excluded.rack, registered_at = excluded.registered_at,
            expires_at = excluded.expires_at
    RETURNING n.epoch INTO v_epoch;

    UPDATE leases SET expires_at = '-infinity'
     WHERE holder = p_node AND holder_epoch < v_epoch AND expires_at > now();

    PERFORM mink_log_change('node_registered', jsonb_build_object(
        'node_id', p_node, 'epoch', v_epoch, 'host', p_host, 'port', p_port, 'rack', p_rack));
    RETURN v_epoch;
END $$;

-- Clean leave: not live any more (expires_at = -infinity, which heartbeats cannot undo), the
-- row and its epoch stay. Its leases are released.
CREATE FUNCTION mink_leave_node(p_node integer, p_epoch bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE nodes SET expires_at = '-infinity'
     WHERE node_id = p_node AND epoch = p_epoch AND expires_at <> '-infinity';
    IF NOT FOUND THEN
        IF EXISTS (SELECT 1 FROM nodes WHERE node_id = p_node AND epoch = p_epoch) THEN
            RETURN;  -- left already
        END IF;
        RAISE EXCEPTION USING ERRCODE = 'MK001', MESSAGE = 'stale_node_epoch';
    END IF;

    UPDATE leases SET expires_at = '-infinity'
     WHERE holder = p_node AND holder_epoch = p_epoch AND expires_at > now();

    PERFORM mink_log_change('node_left', jsonb_build_object('node_id', p_node, 'epoch', p_epoch));
END $$;

-- Takeover: "register the dead node at epoch + 1", only if it is still at the epoch the caller
-- saw and not live. Returns the node's epoch afterwards; if it had moved past the seen epoch
-- already, the seen epoch is fenced anyway and nothing is written.
CREATE FUNCTION mink_fence_node(p_node integer, p_seen_epoch bigint) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    n nodes;
BEGIN
    SELECT * INTO n FROM nodes WHERE node_id = p_node FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MK006', MESSAGE = 'unknown_node';
    END IF;
    IF n.epoch > p_seen_epoch THEN
        RETURN n.epoch;
    END IF;
    IF n.epoch < p_seen_epoch THEN
        RAISE EXCEPTION USING ERRCODE = 'MK006', MESSAGE = 'unknown_node_epoch';
    END IF;
    IF n.expires_at > now() THEN
        RAISE EXCEPTION USING ERRCODE = 'MK007', MESSAGE = 'node_is_live';
    END IF;

    UPDATE nodes SET epoch = epoch + 1 WHERE node_id = p_node RETURNING epoch INTO n.epoch;
    UPDATE leases SET expires_at = '-infinity'
     WHERE holder = p_node AND holder_epoch < n.epoch AND expires_at > now();

    PERFORM mink_log_change('node_fenced', jsonb_build_object(
        'node_id', p_node, 'epoch', n.epoch, 'fenced_epoch', p_seen_epoch));
    RETURN n.epoch;
END $$;


-- Leases -------------------------------------------------------------------------------------

-- Take the lease if it is free or expired, or keep it if this node incarnation holds it.
-- The lease epoch grows whenever a new tenure starts. NULL: held by someone else.
CREATE FUNCTION mink_acquire_lease(p_scope text, p_node integer, p_node_epoch bigint,
                                   p_ttl_s double precision) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_epoch bigint;
BEGIN
    PERFORM 1 FROM nodes
     WHERE node_id = p_node AND epoch = p_node_epoch AND expires_at > now()
       FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MK001', MESSAGE = 'stale_node_epoch';
    END IF;

    INSERT INTO leases AS l (scope, holder, holder_epoch, epoch, acquired_at, expires_at)
    VALUES (p_scope, p_node, p_node_epoch, 1, now(), now() + p_ttl_s * interval '1 second')
    ON CONFLICT (scope) DO UPDATE
        SET epoch = CASE WHEN l.expires_at > now() THEN l.epoch ELSE l.epoch + 1 END,
            acquired_at = CASE WHEN l.expires_at > now() THEN l.acquired_at ELSE now() END,
            holder = excluded.holder,
            holder_epoch = excluded.holder_epoch,
            expires_at = excluded.expires_at
      WHERE l.expires_at <= now()
         OR (l.holder = excluded.holder AND l.holder_epoch = excluded.holder_epoch)
    RETURNING l.epoch INTO v_epoch;
    RETURN v_epoch;
END $$;


-- Topics and partitions ----------------------------------------------------------------------

CREATE FUNCTION mink_create_topic(p_name text, p_partitions integer, p_config jsonb,
                                  p_leaders integer[], p_topic_id uuid,
                                  p_coordinator_epoch bigint) RETURNS SETOF topics
LANGUAGE plpgsql AS $$
DECLARE
    t topics;
BEGIN
    PERFORM mink_check_coordinator(p_coordinator_epoch);
    IF p_partitions IS NULL OR p_partitions < 1 THEN
        RAISE EXCEPTION USING ERRCODE = 'MK005',
            MESSAGE = format('a topic needs at least one partition, not %s', p_partitions);
    END IF;
    IF coalesce(cardinality(p_leaders), 0) <> p_partitions THEN
        RAISE EXCEPTION USING ERRCODE = 'MK005',
            MESSAGE = format('%s leaders given for %s partitions', cardinality(p_leaders), p_partitions);
    END IF;
    IF EXISTS (SELECT 1 FROM topics WHERE name = p_name AND deleted_at IS NULL) THEN
        RAISE EXCEPTION USING ERRCODE = 'MK004', MESSAGE = p_name;
    END IF;

    -- (a concurrent creation of the same name fails on the unique index topics_live_name)
    INSERT INTO topics (topic_id, name, partitions, config)
    VALUES (coalesce(p_topic_id, gen_random_uuid()), p_name, p_partitions, coalesce(p_config, '{}'))
    RETURNING * INTO t;

    INSERT INTO partitions (topic_id, partition, leader_node, leader_epoch)
    SELECT t.topic_id, l.n - 1, l.leader, 0
      FROM unnest(p_leaders) WITH ORDINALITY AS l(leader, n);

    PERFORM mink_log_change('topic_created', jsonb_build_object(
        'topic_id', t.topic_id, 'name', t.name, 'partitions', t.partitions));
    RETURN NEXT t;
END $$;

-- Delete a live topic: it keeps its row (deleted_at set); its partitions, index rows,
-- producer states and leader epochs go. The WAL objects its index rows used are found by the
-- garbage collector once no index row uses them (they are shared with other partitions).
CREATE FUNCTION mink_delete_topic(p_name text, p_topic_id uuid, p_coordinator_epoch bigint)
RETURNS SETOF topics
LANGUAGE plpgsql AS $$
DECLARE
    t topics;
BEGIN
    PERFORM mink_check_coordinator(p_coordinator_epoch);
    UPDATE topics SET deleted_at = now()
     WHERE deleted_at IS NULL
       AND (name = p_name OR p_name IS NULL)
       AND (topic_id = p_topic_id OR p_topic_id IS NULL)
       AND (p_name IS NOT NULL OR p_topic_id IS NOT NULL)
    RETURNING * INTO t;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MK003', MESSAGE = coalesce(p_name, p_topic_id::text);
    END IF;

    PERFORM 1 FROM partitions WHERE topic_id = t.topic_id ORDER BY partition FOR UPDATE;
    DELETE FROM batch_index WHERE topic_id = t.topic_id;
    DELETE FROM producer_state WHERE topic_id = t.topic_id;
    DELETE FROM leader_epochs WHERE topic_id = t.topic_id;
    DELETE FROM partitions WHERE topic_id = t.topic_id;

    PERFORM mink_log_change('topic_deleted', jsonb_build_object(
        'topic_id', t.topic_id, 'name', t.name));
    RETURN NEXT t;
END $$;

-- Grow a topic to p_total partitions; the new ones get the given leaders at leader epoch 0.
CREATE FUNCTION mink_create_partitions(p_name text, p_total integer, p_leaders integer[],
                                       p_coordinator_epoch bigint) RETURNS SETOF topics
LANGUAGE plpgsql AS $$
DECLARE
    t topics;
    v_before integer;
BEGIN
    PERFORM mink_check_coordinator(p_coordinator_epoch);
    SELECT * INTO t FROM topics WHERE name = p_name AND deleted_at IS NULL FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MK003', MESSAGE = p_name;
    END IF;
    v_before := t.partitions;
    IF p_total IS NULL OR p_total <= v_before THEN
        RAISE EXCEPTION USING ERRCODE = 'MK005',
            MESSAGE = format('topic %s has %s partitions, it can only grow (asked for %s)',
                             p_name, v_before, p_total);
    END IF;
    IF coalesce(cardinality(p_leaders), 0) <> p_total - v_before THEN
        RAISE EXCEPTION USING ERRCODE = 'MK005',
            MESSAGE = format('%s leaders given for %s new partitions',
                             coalesce(cardinality(p_leaders), 0), p_total - v_before);
    END IF;

    INSERT INTO partitions (topic_id, partition, leader_node, leader_epoch)
    SELECT t.topic_id, v_before + l.n - 1, l.leader, 0
      FROM unnest(p_leaders) WITH ORDINALITY AS l(leader, n);
    UPDATE topics SET partitions = p_total WHERE topic_id = t.topic_id RETURNING * INTO t;

    PERFORM mink_log_change('partitions_created', jsonb_build_object(
        'topic_id', t.topic_id, 'name', t.name, 'partitions', p_total, 'previous', v_before));
    RETURN NEXT t;
END $$;

-- LeadBucket: a new leader (possibly the same node) at leader epoch + 1. Optional
-- compare-and-set on the leader epoch the coordinator based its decision on.
CREATE FUNCTION mink_lead_partition(p_topic_id uuid, p_partition integer, p_node integer,
                                    p_coordinator_epoch bigint, p_expected_leader_epoch integer)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    p partitions;
BEGIN
    PERFORM mink_check_coordinator(p_coordinator_epoch);
    SELECT * INTO p FROM partitions
     WHERE topic_id = p_topic_id AND partition = p_partition FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MK003',
            MESSAGE = format('unknown partition %s/%s', p_topic_id, p_partition);
    END IF;
    IF p_expected_leader_epoch IS NOT NULL AND p.leader_epoch <> p_expected_leader_epoch THEN
        RAISE EXCEPTION USING ERRCODE = 'MK001', MESSAGE = 'leader_epoch_changed';
    END IF;

    UPDATE partitions SET leader_node = p_node, leader_epoch = leader_epoch + 1
     WHERE topic_id = p_topic_id AND partition = p_partition
    RETURNING leader_epoch INTO p.leader_epoch;

    PERFORM mink_log_change('leader_changed', jsonb_build_object(
        'topic_id', p_topic_id, 'partition', p_partition, 'leader', p_node,
        'leader_epoch', p.leader_epoch, 'previous_leader', p.leader_node));
    RETURN p.leader_epoch;
END $$;


-- Streams ------------------------------------------------------------------------------------

-- OpenStream: only the partition's leader at its current leader epoch, with its current node
-- epoch. Records the opener and the start offset of the leader epoch (Kafka's leader-epoch
-- cache: epochs that wrote nothing are dropped, as Kafka's assign() does).
CREATE FUNCTION mink_open_stream(p_topic_id uuid, p_partition integer, p_leader_epoch integer,
                                 p_node integer, p_node_epoch bigint) RETURNS SETOF partitions
LANGUAGE plpgsql AS $$
DECLARE
    p partitions;
BEGIN
    SELECT * INTO p FROM partitions
     WHERE topic_id = p_topic_id AND partition = p_partition FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MK003',
            MESSAGE = format('unknown partition %s/%s', p_topic_id, p_partition);
    END IF;
    IF NOT EXISTS (SELECT 1 FROM nodes WHERE node_id = p_node AND epoch = p_node_epoch) THEN
        RAISE EXCEPTION USING ERRCODE = 'MK001', MESSAGE = 'stale_node_epoch';
    END IF;
    IF p.leader_node IS DISTINCT FROM p_node OR p.leader_epoch <> p_leader_epoch THEN
        RAISE EXCEPTION USING ERRCODE = 'MK002',
            MESSAGE = CASE WHEN p.leader_node IS DISTINCT FROM p_node THEN 'not_leader'
                           WHEN p.leader_epoch > p_leader_epoch THEN 'stale_leader_epoch'
                           ELSE 'unknown_leader_epoch' END,
            DETAIL = jsonb_build_object('leader_node', p.leader_node,
                                        'leader_epoch', p.leader_epoch)::text;
    END IF;

    DELETE FROM leader_epochs
     WHERE topic_id = p_topic_id AND partition = p_partition
       AND leader_epoch < p_leader_epoch AND start_offset >= p.committed_end;
    INSERT INTO leader_epochs (topic_id, partition, leader_epoch, start_offset)
    VALUES (p_topic_id, p_partition, p_leader_epoch, p.committed_end)
    ON CONFLICT DO NOTHING;

    UPDATE partitions
       SET stream_state = 'open', opened_by_node = p_node, opened_by_epoch = p_node_epoch,
           open_leader_epoch = p_leader_epoch
     WHERE topic_id = p_topic_id AND partition = p_partition
    RETURNING * INTO p;
    RETURN NEXT p;
END $$;


-- CommitWal ----------------------------------------------------------------------------------

-- One partition range of a WAL object, as CommitWal receives it (JSON keys = field names).
CREATE TYPE mink_wal_range AS (
    topic_id        uuid,
    partition       integer,
    leader_epoch    integer,
    base_offset     bigint,
    last_offset     bigint,
    byte_start      bigint,
    byte_end        bigint,
    max_timestamp   bigint,
    batch_count     integer,
    producer_states jsonb    -- [{"producer_id", "producer_epoch", "state": base64}, ...]
);

-- The ranges of CommitWal's objects, with their positions (object, range). Declared VOLATILE
-- so that it is not inlined and the planner uses its small ROWS estimate: lookups of the
-- partitions written then go through the primary key, however many partitions there are.
CREATE FUNCTION mink_wal_ranges(p_objects jsonb)
RETURNS TABLE (obj integer, rng integer, key text, r mink_wal_range)
LANGUAGE sql VOLATILE ROWS 20 AS $$
    SELECT x.n::integer, y.i::integer, x.o->>'key', jsonb_populate_record(NULL::mink_wal_range, y.j)
      FROM jsonb_array_elements(p_objects) WITH ORDINALITY AS x(o, n)
     CROSS JOIN LATERAL jsonb_array_elements(x.o->'ranges') WITH ORDINALITY AS y(j, i);
$$;

-- Serialize transactions on object keys (CommitWal, outcome read-back, deletion queueing).
CREATE FUNCTION mink_lock_object_keys(p_keys text[]) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(7301, s.h)
       FROM (SELECT DISTINCT hashtext(k) AS h FROM unnest(p_keys) AS k ORDER BY 1) AS s;
END $$;

-- Mark keys nobody decided on yet as abandoned: never committable, queued for deletion.
CREATE FUNCTION mink_abandon_objects(p_keys text[], p_reason text) RETURNS void
LANGUAGE sql AS $$
    WITH abandoned AS (
        INSERT INTO wal_objects (key, committed, outcome, gc_queued_at)
        SELECT DISTINCT k, false, '{"committed": false, "reason": "abandoned", "ranges": []}'::jsonb, now()
          FROM unnest(p_keys) AS k
        ON CONFLICT (key) DO NOTHING
        RETURNING key
    )
    INSERT INTO objects_to_delete (key, reason)
    SELECT key, p_reason FROM abandoned
    ON CONFLICT (key) DO NOTHING;
$$;

-- The outcome of an object none of whose ranges can be looked at.
CREATE FUNCTION mink_refused_outcome(p_object jsonb, p_reason text) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_build_object(
        'committed', false,
        'reason', p_reason,
        'ranges', coalesce((SELECT jsonb_agg(jsonb_build_array(false, p_reason, NULL))
                              FROM jsonb_array_elements(p_object->'ranges')), '[]'::jsonb));
$$;

-- CommitWal (DESIGN "Write path", step 4). p_objects: [{"key", "size", "ranges": [range...]}].
-- Returns one row per object: its outcome
--   {"committed": bool, "reason": text|null, "ranges": [[accepted, reason, committed_end], ...]}
-- and whether it is the stored outcome of an earlier call (repeated).
--   * A key decided before: its first outcome, nothing changes.
--   * A stale node epoch: every range refused ('stale_node_epoch'), nothing written.
--   * Otherwise each range on its own, partition by partition, in call order within a
--     partition (a range is checked against the state the ranges before it left):
--     unknown_partition, invalid_range, stale_leader_epoch (the partition's leader epoch is not
--     the range's), not_open_by_node (the stream is not open by this node incarnation at that
--     leader epoch), offset_mismatch (base_offset is not exactly the committed end).
--     Accepted: an index row, committed_end = last_offset + 1, producer states upserted.
--     An object with an accepted range is committed; one with none is recorded as refused
--     and queued for deletion.
CREATE FUNCTION mink_commit_wal(p_node integer, p_node_epoch bigint, p_objects jsonb)
RETURNS TABLE (object_key text, object_outcome jsonb, repeated boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_keys   text[];
    v_new    jsonb;    -- the objects not decided before, in call order
    r        record;
    v_reason text;
    v_seq    integer := 0;
    -- the partition being walked
    v_topic  uuid;
    v_part   integer;
    v_end    bigint;
    v_max_ts bigint;
    v_moved  boolean := false;
    -- one decision per range, in walk order
    d_obj    integer[] := '{}';
    d_rng    integer[] := '{}';
    d_ok     boolean[] := '{}';
    d_reason text[]    := '{}';
    d_end    bigint[]  := '{}';
    -- accepted ranges: the index rows and producer states to write
    a_topic  uuid[]    := '{}';
    a_part   integer[] := '{}';
    a_base   bigint[]  := '{}';
    a_last   bigint[]  := '{}';
    a_key    text[]    := '{}';
    a_bstart bigint[]  := '{}';
    a_bend   bigint[]  := '{}';
    a_ts     bigint[]  := '{}';
    a_count  integer[] := '{}';
    a_run_ts bigint[]  := '{}';
    a_seq    integer[] := '{}';
    a_states jsonb[]   := '{}';
    -- partitions whose committed end moved
    m_topic  uuid[]    := '{}';
    m_part   integer[] := '{}';
    m_end    bigint[]  := '{}';
    m_ts     bigint[]  := '{}';
BEGIN
    SELECT array_agg(o->>'key') INTO v_keys FROM jsonb_array_elements(p_objects) AS o;
    IF v_keys IS NULL THEN
        RETURN;
    END IF;

    -- 1. Serialize on the keys: a repeat racing the first call, an outcome read-back or a
    --    deletion of one of these keys waits for this transaction.
    PERFORM mink_lock_object_keys(v_keys);

    -- 2. Keys decided before: their first outcome. The others are new.
    v_new := p_objects;
    RETURN QUERY SELECT w.key, w.outcome, true FROM wal_objects AS w WHERE w.key = ANY (v_keys);
    IF FOUND THEN
        SELECT coalesce(jsonb_agg(x.o ORDER BY x.n), '[]'::jsonb) INTO v_new
          FROM jsonb_array_elements(p_objects) WITH ORDINALITY AS x(o, n)
         WHERE NOT EXISTS (SELECT 1 FROM wal_objects AS w WHERE w.key = x.o->>'key');
        IF jsonb_array_length(v_new) = 0 THEN
            RETURN;
        END IF;
    END IF;

    -- 3. The node epoch, once.
    IF NOT EXISTS (SELECT 1 FROM nodes WHERE node_id = p_node AND epoch = p_node_epoch) THEN
        RETURN QUERY SELECT o->>'key', mink_refused_outcome(o, 'stale_node_epoch'), false
                       FROM jsonb_array_elements(v_new) AS o;
        RETURN;
    END IF;

    -- 4. Lock the partitions written, in a fixed order.
    PERFORM 1 FROM mink_wal_ranges(v_new) AS w
      JOIN partitions AS p ON p.topic_id = (w.r).topic_id AND p.partition = (w.r).partition
     ORDER BY p.topic_id, p.partition
       FOR UPDATE OF p;

    -- 5. Decide every range.
    FOR r IN
        SELECT w.obj, w.rng, w.key, (w.r).*,
               p.topic_id IS NOT NULL AS known, p.leader_epoch AS partition_leader_epoch,
               p.stream_state, p.opened_by_node, p.opened_by_epoch, p.open_leader_epoch,
               p.committed_end, p.max_timestamp AS partition_max_timestamp
          FROM mink_wal_ranges(v_new) AS w
          LEFT JOIN partitions AS p
            ON p.topic_id = (w.r).topic_id AND p.partition = (w.r).partition
         ORDER BY (w.r).topic_id, (w.r).partition, w.obj, w.rng
    LOOP
        IF v_seq = 0 OR r.topic_id IS DISTINCT FROM v_topic OR r.partition IS DISTINCT FROM v_part THEN
            IF v_moved THEN
                m_topic := array_append(m_topic, v_topic);
                m_part := array_append(m_part, v_part);
                m_end := array_append(m_end, v_end);
                m_ts := array_append(m_ts, v_max_ts);
            END IF;
            v_topic := r.topic_id;
            v_part := r.partition;
            v_end := r.committed_end;
            v_max_ts := r.partition_max_timestamp;
            v_moved := false;
        END IF;
        v_seq := v_seq + 1;

        v_reason := CASE
            WHEN NOT r.known THEN 'unknown_partition'
            WHEN r.last_offset < r.base_offset OR r.byte_end < r.byte_start THEN 'invalid_range'
            WHEN r.leader_epoch IS DISTINCT FROM r.partition_leader_epoch THEN 'stale_leader_epoch'
            WHEN r.stream_state <> 'open'
              OR r.opened_by_node IS DISTINCT FROM p_node
              OR r.opened_by_epoch IS DISTINCT FROM p_node_epoch
              OR r.open_leader_epoch IS DISTINCT FROM r.leader_epoch THEN 'not_open_by_node'
            WHEN r.base_offset IS DISTINCT FROM v_end THEN 'offset_mismatch'
        END;

        IF v_reason IS NULL THEN
            v_end := r.last_offset + 1;
            v_max_ts := greatest(v_max_ts, r.max_timestamp);
            v_moved := true;
            a_topic := array_append(a_topic, r.topic_id);
            a_part := array_append(a_part, r.partition);
            a_base := array_append(a_base, r.base_offset);
            a_last := array_append(a_last, r.last_offset);
            a_key := array_append(a_key, r.key);
            a_bstart := array_append(a_bstart, r.byte_start);
            a_bend := array_append(a_bend, r.byte_end);
            a_ts := array_append(a_ts, r.max_timestamp);
            a_count := array_append(a_count, r.batch_count);
            a_run_ts := array_append(a_run_ts, v_max_ts);
            a_seq := array_append(a_seq, v_seq);
            a_states := array_append(a_states, coalesce(r.producer_states, '[]'::jsonb));
        END IF;
        d_obj := array_append(d_obj, r.obj);
        d_rng := array_append(d_rng, r.rng);
        d_ok := array_append(d_ok, v_reason IS NULL);
        d_reason := array_append(d_reason, v_reason);
        d_end := array_append(d_end, v_end);
    END LOOP;
    IF v_moved THEN
        m_topic := array_append(m_topic, v_topic);
        m_part := array_append(m_part, v_part);
        m_end := array_append(m_end, v_end);
        m_ts := array_append(m_ts, v_max_ts);
    END IF;

    -- 6. One index row per accepted range.
    INSERT INTO batch_index (topic_id, partition, base_offset, last_offset, object_key,
                             byte_start, byte_end, max_timestamp, batch_count,
                             running_max_timestamp)
    SELECT * FROM unnest(a_topic, a_part, a_base, a_last, a_key, a_bstart, a_bend, a_ts,
                         a_count, a_run_ts);

    -- 7. Committed ends (high watermarks) move.
    UPDATE partitions AS p
       SET committed_end = m.committed_end, max_timestamp = m.max_timestamp
      FROM unnest(m_topic, m_part, m_end, m_ts)
           AS m(topic_id, partition, committed_end, max_timestamp)
     WHERE p.topic_id = m.topic_id AND p.partition = m.partition;

    -- 8. Producer states carried by accepted ranges; per producer the last one wins.
    INSERT INTO producer_state AS s (topic_id, partition, producer_id, producer_epoch, state,
                                     updated_at)
    SELECT DISTINCT ON (a.topic_id, a.partition, (e.ps->>'producer_id')::bigint)
           a.topic_id, a.partition, (e.ps->>'producer_id')::bigint,
           (e.ps->>'producer_epoch')::integer, decode(e.ps->>'state', 'base64'), now()
      FROM unnest(a_topic, a_part, a_seq, a_states) AS a(topic_id, partition, seq, states)
     CROSS JOIN LATERAL jsonb_array_elements(a.states) WITH ORDINALITY AS e(ps, n)
     ORDER BY a.topic_id, a.partition, (e.ps->>'producer_id')::bigint, a.seq DESC, e.n DESC
    ON CONFLICT (topic_id, partition, producer_id) DO UPDATE
        SET producer_epoch = excluded.producer_epoch, state = excluded.state,
            updated_at = excluded.updated_at;

    -- 9. Record the decisions. All ranges refused: not committed, queued for deletion.
    RETURN QUERY
    WITH decided AS (
        SELECT d.obj,
               jsonb_agg(jsonb_build_array(d.ok, d.reason, d.committed_end) ORDER BY d.rng) AS ranges,
               bool_or(d.ok) AS committed
          FROM unnest(d_obj, d_rng, d_ok, d_reason, d_end)
               AS d(obj, rng, ok, reason, committed_end)
         GROUP BY d.obj
    ), recorded AS (
        INSERT INTO wal_objects (key, node_id, node_epoch, size, committed, outcome, gc_queued_at)
        SELECT x.o->>'key', p_node, p_node_epoch, (x.o->>'size')::bigint,
               coalesce(dd.committed, false),
               jsonb_build_object('committed', coalesce(dd.committed, false), 'reason', NULL,
                                  'ranges', coalesce(dd.ranges, '[]'::jsonb)),
               CASE WHEN coalesce(dd.committed, false) THEN NULL ELSE now() END
          FROM jsonb_array_elements(v_new) WITH ORDINALITY AS x(o, n)
          LEFT JOIN decided AS dd ON dd.obj = x.n
        RETURNING wal_objects.key, wal_objects.outcome, wal_objects.committed
    ), queued AS (
        INSERT INTO objects_to_delete (key, reason)
        SELECT rec.key, 'refused' FROM recorded AS rec WHERE NOT rec.committed
        ON CONFLICT (key) DO NOTHING
    )
    SELECT rec.key, rec.outcome, false FROM recorded AS rec;
END $$;

-- The outcome of a CommitWal whose reply was lost. Waits for a commit of these keys that is
-- still running; with p_settle, keys nobody decided on are abandoned, so that a late commit
-- of them is refused and the answer "not committed" stays true.
CREATE FUNCTION mink_commit_outcome(p_keys text[], p_settle boolean)
RETURNS TABLE (object_key text, object_outcome jsonb)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM mink_lock_object_keys(p_keys);
    IF p_settle THEN
        PERFORM mink_abandon_objects(p_keys, 'abandoned');
    END IF;
    RETURN QUERY SELECT w.key, w.outcome FROM wal_objects AS w WHERE w.key = ANY (p_keys);
END $$;


-- Garbage ------------------------------------------------------------------------------------

-- Queue object keys for deletion, except those an index row still uses. Keys CommitWal never
-- decided on are abandoned first, so they can never be committed after being deleted.
-- Returns the keys queued now.
CREATE FUNCTION mink_queue_for_deletion(p_keys text[], p_reason text) RETURNS SETOF text
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM mink_lock_object_keys(p_keys);
    INSERT INTO wal_objects (key, committed, outcome, gc_queued_at)
    SELECT DISTINCT k, false, '{"committed": false, "reason": "abandoned", "ranges": []}'::jsonb, now()
      FROM unnest(p_keys) AS k
    ON CONFLICT (key) DO NOTHING;

    RETURN QUERY
    WITH unused AS (
        SELECT DISTINCT k AS key FROM unnest(p_keys) AS k
         WHERE NOT EXISTS (SELECT 1 FROM batch_index AS b WHERE b.object_key = k)
    ), marked AS (
        UPDATE wal_objects AS w SET gc_queued_at = now()
          FROM unused AS u
         WHERE w.key = u.key AND w.gc_queued_at IS NULL
    ), queued AS (
        INSERT INTO objects_to_delete (key, reason)
        SELECT u.key, p_reason FROM unused AS u
        ON CONFLICT (key) DO NOTHING
        RETURNING objects_to_delete.key
    )
    SELECT q.key FROM queued AS q;
END $$;
