-- Control-plane work in proportion to a batch, not to a statement per partition (issue 22):
-- a node given thousands of partitions at once (a new topic, a failover) opened them one
-- statement each, and a failover's thousands of moves were one function call, one change-log
-- row and one NOTIFY each.

-- OpenStream for many partitions in one round trip. Each partition is opened by
-- mink_open_stream_with_producers, after mink_relead_own_partition where p_fresh says so (a
-- fresh leader epoch first: seed 000's "opened or closed at the current leader epoch"), with
-- its own refusal (stale_node_epoch, not_leader, leader_epoch_changed, unknown partition, ...)
-- returned in its row instead of failing the others. Partitions are taken in (topic_id,
-- partition) order, the order every CommitWal locks them in, so a batch and a commit never
-- wait on each other in a cycle; the row locks are held to the end of the batch's transaction.
CREATE FUNCTION mink_open_streams(p_topic_ids uuid[], p_partitions integer[],
                                  p_leader_epochs integer[], p_fresh boolean[],
                                  p_node integer, p_node_epoch bigint)
RETURNS TABLE (o_topic_id uuid, o_partition integer, o_refusal text, o_message text,
               o_detail text, o_stream partitions, o_producers jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    v_n bigint;
    v_epoch integer;
    v_opened record;
BEGIN
    FOR v_n IN SELECT x.n FROM unnest(p_topic_ids, p_partitions) WITH ORDINALITY AS x(t, p, n)
                ORDER BY x.t, x.p
    LOOP
        o_topic_id := p_topic_ids[v_n];
        o_partition := p_partitions[v_n];
        o_refusal := NULL;
        o_message := NULL;
        o_detail := NULL;
        BEGIN
            v_epoch := p_leader_epochs[v_n];
            IF p_fresh[v_n] THEN
                v_epoch := mink_relead_own_partition(o_topic_id, o_partition, p_node,
                                                     p_node_epoch, v_epoch);
            END IF;
            SELECT * INTO v_opened
              FROM mink_open_stream_with_producers(o_topic_id, o_partition, v_epoch, p_node,
                                                   p_node_epoch);
            o_stream := v_opened.stream;
            o_producers := v_opened.producers;
        EXCEPTION WHEN SQLSTATE 'MK001' OR SQLSTATE 'MK002' OR SQLSTATE 'MK003' THEN
            GET STACKED DIAGNOSTICS o_refusal = RETURNED_SQLSTATE, o_message = MESSAGE_TEXT,
                                    o_detail = PG_EXCEPTION_DETAIL;
            o_stream := NULL;
            o_producers := NULL;
        END;
        RETURN NEXT;
    END LOOP;
END $$;

-- Many LeadBuckets (a failover, a rebalance, a drain) in one transaction, all or none: under
-- the coordinator epoch, each compared with the leader epoch it expects (NULL: unchecked), the
-- rows locked in (topic_id, partition) order; one change-log row names the topics. Returns
-- each move's new leader epoch by its position (1-based).
CREATE FUNCTION mink_lead_partitions(p_coordinator_epoch bigint, p_topic_ids uuid[],
                                     p_partitions integer[], p_nodes integer[],
                                     p_expected integer[])
RETURNS TABLE (o_n bigint, o_leader_epoch integer)
LANGUAGE plpgsql AS $$
DECLARE
    v_moves integer := coalesce(cardinality(p_topic_ids), 0);
    v_found integer;
BEGIN
    PERFORM mink_check_coordinator(p_coordinator_epoch);
    IF (SELECT count(DISTINCT (m.t, m.i)) FROM unnest(p_topic_ids, p_partitions) AS m(t, i))
       <> v_moves THEN
        RAISE EXCEPTION USING ERRCODE = 'MK005', MESSAGE = 'a partition moved twice in one batch';
    END IF;
    PERFORM 1 FROM partitions AS p
      JOIN unnest(p_topic_ids, p_partitions) AS m(t, i)
        ON p.topic_id = m.t AND p.partition = m.i
     ORDER BY p.topic_id, p.partition
       FOR UPDATE OF p;
    GET DIAGNOSTICS v_found = ROW_COUNT;
    IF v_found <> v_moves THEN
        RAISE EXCEPTION USING ERRCODE = 'MK003', MESSAGE = 'unknown partition in the moves';
    END IF;
    IF EXISTS (SELECT 1 FROM partitions AS p
                 JOIN unnest(p_topic_ids, p_partitions, p_expected) AS m(t, i, e)
                   ON p.topic_id = m.t AND p.partition = m.i
                WHERE m.e IS NOT NULL AND p.leader_epoch <> m.e) THEN
        RAISE EXCEPTION USING ERRCODE = 'MK001', MESSAGE = 'leader_epoch_changed';
    END IF;

    RETURN QUERY
    WITH moved AS (
        UPDATE partitions AS p SET leader_node = m.node, leader_epoch = p.leader_epoch + 1
          FROM unnest(p_topic_ids, p_partitions, p_nodes) WITH ORDINALITY AS m(t, i, node, n)
         WHERE p.topic_id = m.t AND p.partition = m.i
        RETURNING m.n, p.leader_epoch)
    SELECT moved.n, moved.leader_epoch FROM moved ORDER BY moved.n;

    IF v_moves > 0 THEN
        PERFORM mink_log_change('leaders_changed', jsonb_build_object(
            'topic_ids', (SELECT jsonb_agg(DISTINCT t) FROM unnest(p_topic_ids) AS t),
            'partitions', v_moves));
    END IF;
END $$;
