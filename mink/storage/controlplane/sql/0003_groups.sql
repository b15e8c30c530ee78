-- Consumer groups: each group's state (written when a generation completes) and its committed
-- offsets. Kafka keeps both in the internal topic `__consumer_offsets`; Mink keeps them here,
-- and the group's partition of that topic only decides who coordinates it: that partition's
-- leader. Every write is fenced by the partition's leader epoch.
--
-- Nothing here writes the change log: groups are data, not control plane.

-- One row per group a coordinator has written: a generation completed (SyncGroup, an empty
-- generation), a static member was replaced, or offsets were committed (which creates the row).
CREATE TABLE consumer_groups (
    group_id              text        PRIMARY KEY,
    -- the partition of __consumer_offsets the group maps to: whoever leads it loads the group
    coordinator_partition integer     NOT NULL,
    protocol_type         text,                   -- NULL: no member ever joined
    protocol_name         text,                   -- NULL: no generation with members
    generation            integer     NOT NULL DEFAULT 0,
    leader                text,                   -- member id of the leader, NULL when empty
    -- [{member_id, group_instance_id, client_id, client_host, rebalance_timeout_ms,
    --   session_timeout_ms, protocol_type, protocols: [[name, base64 metadata]],
    --   assignment: base64}, ...]; empty for an Empty group
    members               jsonb       NOT NULL DEFAULT '[]',
    -- who wrote the state last (for operators; the fence is checked, not stored)
    written_by_node       integer,
    written_leader_epoch  integer,
    updated_at            timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX consumer_groups_partition ON consumer_groups (coordinator_partition);

-- Committed offsets, keyed by topic name as Kafka keys them.
CREATE TABLE group_offsets (
    group_id         text        NOT NULL REFERENCES consumer_groups (group_id) ON DELETE CASCADE,
    topic            text        NOT NULL,
    partition        integer     NOT NULL,
    committed_offset bigint      NOT NULL,
    leader_epoch     integer     NOT NULL DEFAULT -1,  -- -1: the client did not say
    metadata         text,
    committed_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic, partition)
);


-- The fence: the caller is the leader of the group's partition of __consumer_offsets at this
-- leader epoch, with this (current, live) node epoch. Shared locks on the node row and the
-- partition row (in the lock order of 0002_operations.sql) keep a LeadBucket or a node fence
-- from committing while the write runs: a new coordinator, which loads after its leader epoch
-- is committed, sees every write its predecessor made, and none made after.
CREATE FUNCTION mink_check_group_coordinator(p_topic_id uuid, p_partition integer,
                                             p_leader_epoch integer, p_node integer,
                                             p_node_epoch bigint) RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM nodes
     WHERE node_id = p_node AND epoch = p_node_epoch AND expires_at > now()
       FOR SHARE;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM 1 FROM partitions
     WHERE topic_id = p_topic_id AND partition = p_partition
       AND leader_node = p_node AND leader_epoch = p_leader_epoch
       FOR SHARE;
    RETURN FOUND;
END $$;

-- StoreGroup: the group's state as of a completed generation. false: not the coordinator.
CREATE FUNCTION mink_store_group(p_topic_id uuid, p_partition integer, p_leader_epoch integer,
                                 p_node integer, p_node_epoch bigint, p_group_id text,
                                 p_protocol_type text, p_protocol_name text,
                                 p_generation integer, p_leader text, p_members jsonb)
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT mink_check_group_coordinator(p_topic_id, p_partition, p_leader_epoch, p_node,
                                        p_node_epoch) THEN
        RETURN false;
    END IF;
    INSERT INTO consumer_groups AS g (group_id, coordinator_partition, protocol_type,
                                      protocol_name, generation, leader, members,
                                      written_by_node, written_leader_epoch)
    VALUES (p_group_id, p_partition, p_protocol_type, p_protocol_name, p_generation, p_leader,
            p_members, p_node, p_leader_epoch)
    ON CONFLICT (group_id) DO UPDATE
       SET coordinator_partition = EXCLUDED.coordinator_partition,
           protocol_type = EXCLUDED.protocol_type, protocol_name = EXCLUDED.protocol_name,
           generation = EXCLUDED.generation, leader = EXCLUDED.leader,
           members = EXCLUDED.members, written_by_node = EXCLUDED.written_by_node,
           written_leader_epoch = EXCLUDED.written_leader_epoch, updated_at = now();
    RETURN true;
END $$;

-- OffsetCommit: upsert the offsets (one row per partition; no duplicates in one call).
-- A group that never had a generation (simple consumers) gets its row here.
CREATE FUNCTION mink_commit_offsets(p_topic_id uuid, p_partition integer,
                                    p_leader_epoch integer, p_node integer,
                                    p_node_epoch bigint, p_group_id text, p_topics text[],
                                    p_partitions integer[], p_offsets bigint[],
                                    p_epochs integer[], p_metadata text[])
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
    INSERT INTO group_offsets AS o (group_id, topic, partition, committed_offset, leader_epoch,
                                    metadata)
    SELECT p_group_id, c.topic, c.partition, c.committed_offset, c.leader_epoch, c.metadata
      FROM unnest(p_topics, p_partitions, p_offsets, p_epochs, p_metadata)
           AS c(topic, partition, committed_offset, leader_epoch, metadata)
    ON CONFLICT (group_id, topic, partition) DO UPDATE
       SET committed_offset = EXCLUDED.committed_offset, leader_epoch = EXCLUDED.leader_epoch,
           metadata = EXCLUDED.metadata, committed_at = now();
    RETURN true;
END $$;

-- DeleteGroups: the groups and their offsets.
CREATE FUNCTION mink_delete_groups(p_topic_id uuid, p_partition integer,
                                   p_leader_epoch integer, p_node integer,
                                   p_node_epoch bigint, p_group_ids text[])
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT mink_check_group_coordinator(p_topic_id, p_partition, p_leader_epoch, p_node,
                                        p_node_epoch) THEN
        RETURN false;
    END IF;
    DELETE FROM consumer_groups WHERE group_id = ANY (p_group_ids);
    RETURN true;
END $$;

-- OffsetDelete: some committed offsets of one group.
CREATE FUNCTION mink_delete_offsets(p_topic_id uuid, p_partition integer,
                                    p_leader_epoch integer, p_node integer,
                                    p_node_epoch bigint, p_group_id text, p_topics text[],
                                    p_partitions integer[])
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT mink_check_group_coordinator(p_topic_id, p_partition, p_leader_epoch, p_node,
                                        p_node_epoch) THEN
        RETURN false;
    END IF;
    DELETE FROM group_offsets AS o
     USING unnest(p_topics, p_partitions) AS d(topic, partition)
     WHERE o.group_id = p_group_id AND o.topic = d.topic AND o.partition = d.partition;
    RETURN true;
END $$;
