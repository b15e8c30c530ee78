-- Client strings stored exactly. PostgreSQL's text and jsonb cannot hold NUL (U+0000), which
-- Kafka strings may: confluent-kafka sends commit metadata with a trailing NUL, and a commit
-- that failed with UNKNOWN_SERVER_ERROR was re-sent forever. The text columns of groups and
-- topic configs keep their type and hold the checked encoding of mink/storage/pgtext.py;
-- members (member and instance ids, client ids, protocol names, with the byte fields base64
-- inside) move from jsonb to json, which stores its input text as it is, \u0000 included.

ALTER TABLE consumer_groups ALTER COLUMN members DROP DEFAULT;
ALTER TABLE consumer_groups ALTER COLUMN members TYPE json USING members::json;
ALTER TABLE consumer_groups ALTER COLUMN members SET DEFAULT '[]';

DROP FUNCTION mink_store_group(uuid, integer, integer, integer, bigint, text, text, text,
                               integer, text, jsonb);

-- StoreGroup (as in 0003_groups.sql, with members as json). false: not the coordinator.
CREATE FUNCTION mink_store_group(p_topic_id uuid, p_partition integer, p_leader_epoch integer,
                                 p_node integer, p_node_epoch bigint, p_group_id text,
                                 p_protocol_type text, p_protocol_name text,
                                 p_generation integer, p_leader text, p_members json)
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
