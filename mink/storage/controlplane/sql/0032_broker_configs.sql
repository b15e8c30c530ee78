-- Dynamic broker configs (Kafka's KIP-226): what AlterConfigs and IncrementalAlterConfigs
-- set on a BROKER resource. One row per resource: '' is the cluster-wide default (Kafka's
-- <default> entity, an empty resource name), a decimal node id one broker's own. Every node
-- reads the whole table when its view version moves (mink/broker/broker_configs.py), as
-- quotas and ACLs are read (sql/0015, sql/0023), so a change reaches every node with its
-- change-log row and NOTIFY.

CREATE TABLE broker_configs (
    resource_name text        PRIMARY KEY CHECK (resource_name ~ '^([0-9]+)?$'),
    config        jsonb       NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- Replace a resource's configs if they still are p_expected ('{}': none stored), as
-- mink_alter_topic_config does for a topic: 'changed' when another change came first (the
-- caller reads again and retries), 'ok' otherwise. An empty p_config removes the row.
CREATE FUNCTION mink_alter_broker_config(p_resource text, p_expected jsonb, p_config jsonb)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    current jsonb;
BEGIN
    -- a row to lock even when none is stored yet, so two first changes serialize
    INSERT INTO broker_configs (resource_name, config) VALUES (p_resource, '{}')
    ON CONFLICT DO NOTHING;
    SELECT config INTO current FROM broker_configs WHERE resource_name = p_resource
       FOR UPDATE;
    IF current IS DISTINCT FROM p_expected THEN
        RETURN 'changed';
    END IF;
    IF p_config = '{}' THEN
        DELETE FROM broker_configs WHERE resource_name = p_resource;
    ELSE
        UPDATE broker_configs SET config = p_config, updated_at = now()
         WHERE resource_name = p_resource;
    END IF;
    IF current IS DISTINCT FROM p_config THEN
        PERFORM mink_log_change('broker_config_changed',
                                jsonb_build_object('resource_name', p_resource));
    END IF;
    RETURN 'ok';
END $$;
