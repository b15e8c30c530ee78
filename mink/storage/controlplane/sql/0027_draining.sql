-- Controlled shutdown and `mink cluster drain` (issue 25): a draining node is live but takes
-- no new work. The coordinator moves the partitions it leads (and with them the groups and
-- transactional ids they coordinate) to the other live nodes at fresh leader epochs, and
-- leaves it out of every assignment and rebalance.
--
-- draining: NULL  takes work;
--           'shutdown'  a clean stop in progress (SIGTERM); cleared when the node registers
--                       again, so a restarted node takes work at once;
--           'operator'  `mink cluster drain`; kept across restarts until `mink cluster undrain`.
-- Either change writes a change-log row, so every view (and the coordinator) learns it at once.

ALTER TABLE nodes ADD COLUMN draining text CHECK (draining IN ('shutdown', 'operator'));

-- p_epoch: the node's own registration (a stopping node; false unless current and live), or
-- NULL (an operator: any registration of an existing node). An operator's mark is never
-- weakened to 'shutdown'. True if the node is now draining.
CREATE FUNCTION mink_drain_node(p_node integer, p_epoch bigint, p_reason text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    n nodes;
BEGIN
    SELECT * INTO n FROM nodes WHERE node_id = p_node FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MK006', MESSAGE = 'unknown_node';
    END IF;
    IF p_epoch IS NOT NULL AND (n.epoch <> p_epoch OR n.expires_at <= now()) THEN
        RETURN false;
    END IF;
    IF n.draining IS NOT DISTINCT FROM p_reason OR n.draining = 'operator' THEN
        RETURN true;
    END IF;
    UPDATE nodes SET draining = p_reason WHERE node_id = p_node;
    PERFORM mink_log_change('node_draining', jsonb_build_object(
        'node_id', p_node, 'epoch', n.epoch, 'reason', p_reason));
    RETURN true;
END $$;

-- `mink cluster undrain`: the operator's mark goes (a stop in progress stays draining).
-- Returns the mark left: NULL when the node takes work again.
CREATE FUNCTION mink_undrain_node(p_node integer) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    n nodes;
BEGIN
    SELECT * INTO n FROM nodes WHERE node_id = p_node FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = 'MK006', MESSAGE = 'unknown_node';
    END IF;
    IF n.draining = 'operator' THEN
        UPDATE nodes SET draining = NULL WHERE node_id = p_node;
        PERFORM mink_log_change('node_undrained', jsonb_build_object(
            'node_id', p_node, 'epoch', n.epoch));
        RETURN NULL;
    END IF;
    RETURN n.draining;
END $$;

-- RegisterNode as in 0002, and a stop's 'shutdown' mark goes with the old registration.
CREATE OR REPLACE FUNCTION mink_register_node(p_node integer, p_host text, p_port integer,
                                              p_rack text, p_ttl_s double precision)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_epoch bigint;
BEGIN
    INSERT INTO nodes AS n (node_id, epoch, host, port, rack, registered_at, expires_at)
    VALUES (p_node, 1, p_host, p_port, p_rack, now(), now() + p_ttl_s * interval '1 second')
    ON CONFLICT (node_id) DO UPDATE
        SET epoch = n.epoch + 1, host = excluded.host, port = excluded.port,
            rack = excluded.rack, registered_at = excluded.registered_at,
            expires_at = excluded.expires_at,
            draining = CASE WHEN n.draining = 'operator' THEN 'operator' END
    RETURNING n.epoch INTO v_epoch;

    UPDATE leases SET expires_at = '-infinity'
     WHERE holder = p_node AND holder_epoch < v_epoch AND expires_at > now();

    PERFORM mink_log_change('node_registered', jsonb_build_object(
        'node_id', p_node, 'epoch', v_epoch, 'host', p_host, 'port', p_port, 'rack', p_rack));
    RETURN v_epoch;
END $$;
