-- Opening many partitions in one round trip (issue 22): a node given thousands of partitions
-- at once (a new topic, a failover) opened them one statement each.
--
-- Each partition is opened by mink_open_stream_with_producers, with its own refusal
-- (stale_node_epoch, not_leader, unknown partition, ...) returned in its row instead of
-- failing the others. Partitions are taken in (topic_id, partition) order, the order every
-- CommitWal locks them in, so a batch and a commit never wait on each other in a cycle; the
-- row locks are held to the end of the batch's transaction.
CREATE FUNCTION mink_open_streams(p_topic_ids uuid[], p_partitions integer[],
                                  p_leader_epochs integer[], p_node integer,
                                  p_node_epoch bigint)
RETURNS TABLE (o_topic_id uuid, o_partition integer, o_refusal text, o_message text,
               o_detail text, o_stream partitions, o_producers jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    v_n bigint;
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
            SELECT * INTO v_opened
              FROM mink_open_stream_with_producers(o_topic_id, o_partition,
                                                   p_leader_epochs[v_n], p_node,
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
