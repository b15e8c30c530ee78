-- KIP-848 consumer groups: the state of a group using the consumer protocol
-- (ConsumerGroupHeartbeat), so that a new coordinator keeps its group epoch, target
-- assignment, members, member epochs and assignments. Kafka keeps these as records in
-- __consumer_offsets; here one row per group holds them as one json document, rewritten
-- whole at every change, fenced like every group write by the leader epoch of the group's
-- partition of __consumer_offsets (mink_check_group_coordinator, 0003).
--
-- The group's row in consumer_groups (0003) stays what its offsets hang on; this row says
-- the group is a consumer group, and goes with it (DeleteGroups).
CREATE TABLE kip848_groups (
    group_id              text        PRIMARY KEY
                                      REFERENCES consumer_groups (group_id) ON DELETE CASCADE,
    coordinator_partition integer     NOT NULL,
    group_epoch           integer     NOT NULL,
    -- {target_epoch, subscription_metadata: {topic: [id, partitions]}, members: [{member_id,
    --  client_id, client_host, instance_id, rack_id, rebalance_timeout_ms,
    --  subscribed_topic_names, server_assignor, state, member_epoch, previous_member_epoch,
    --  assigned, pending_revocation, target: [[topic id, partition], ...]}]}
    state                 json        NOT NULL,
    written_by_node       integer,
    written_leader_epoch  integer,
    updated_at            timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX kip848_groups_partition ON kip848_groups (coordinator_partition);

-- StoreConsumerGroup: the group's whole state. false: not the coordinator.
CREATE FUNCTION mink_store_consumer_group(p_topic_id uuid, p_partition integer,
                                          p_leader_epoch integer, p_node integer,
                                          p_node_epoch bigint, p_group_id text,
                                          p_group_epoch integer, p_state json)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT mink_check_group_coordinator(p_topic_id, p_partition, p_leader_epoch, p_node,
                                        p_node_epoch) THEN
        RETURN false;
    END IF;
    INSERT INTO consumer_groups (group_id, coordinator_partition, written_by_node,
                                 written_leader_epoch)
    VALUES (p_group_id, p_partition, p_node, p_leader_epoch)
    ON CONFLICT (group_id) DO NOTHING;
    INSERT INTO kip848_groups AS g (group_id, coordinator_partition, group_epoch, state,
                                    written_by_node, written_leader_epoch)
    VALUES (p_group_id, p_partition, p_group_epoch, p_state, p_node, p_leader_epoch)
    ON CONFLICT (group_id) DO UPDATE
       SET coordinator_partition = EXCLUDED.coordinator_partition,
           group_epoch = EXCLUDED.group_epoch, state = EXCLUDED.state,
           written_by_node = EXCLUDED.written_by_node,
           written_leader_epoch = EXCLUDED.written_leader_epoch, updated_at = now();
    RETURN true;
END $$;

-- The group is a classic one again (an empty consumer group replaced by a classic JoinGroup):
-- its consumer-group state goes, its offsets stay.
CREATE FUNCTION mink_drop_consumer_group(p_topic_id uuid, p_partition integer,
                                         p_leader_epoch integer, p_node integer,
                                         p_node_epoch bigint, p_group_id text)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT mink_check_group_coordinator(p_topic_id, p_partition, p_leader_epoch, p_node,
                                        p_node_epoch) THEN
        RETURN false;
    END IF;
    DELETE FROM kip848_groups WHERE group_id = p_group_id;
    RETURN true;
END $$;
