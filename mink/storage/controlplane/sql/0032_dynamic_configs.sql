-- Dynamic configs of BROKER and GROUP resources: what AlterConfigs and
-- IncrementalAlterConfigs set on them (Kafka's KIP-226 broker configs, KIP-848's group
-- configs). One row per resource: for BROKER (4), '' is the cluster-wide default (Kafka's
-- <default> entity, an empty resource name) and a decimal node id one broker's own; for GROUP
-- (32), the group id. Every node reads the whole table when its view version moves
-- (mink/broker/dynamic_configs.py), as quotas and ACLs are read (sql/0015, sql/0023), so a
-- change reaches every node with its change-log row and NOTIFY.

CREATE TABLE dynamic_configs (
    resource_type smallint    NOT NULL,
    resource_name text        NOT NULL,
    config        jsonb       NOT NULL,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (resource_type, resource_name),
    CHECK ((resource_type = 4 AND resource_name ~ '^([0-9]+)?$')
           OR (resource_type = 32 AND resource_name <> ''))
);

-- Replace a resource's configs if they still are p_expected ('{}': none stored), as
-- mink_alter_topic_config does for a topic: 'changed' when another change came first (the
-- caller reads again and retries), 'ok' otherwise. An empty p_config removes the row.
CREATE FUNCTION mink_alter_dynamic_config(p_type smallint, p_name text, p_expected jsonb,
                                          p_config jsonb) RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    current jsonb;
BEGIN
    -- a row to lock even when none is stored yet, so two first changes serialize
    INSERT INTO dynamic_configs (resource_type, resource_name, config)
    VALUES (p_type, p_name, '{}')
    ON CONFLICT DO NOTHING;
    SELECT config INTO current FROM dynamic_configs
     WHERE resource_type = p_type AND resource_name = p_name
       FOR UPDATE;
    IF current IS DISTINCT FROM p_expected THEN
        RETURN 'changed';
    END IF;
    IF p_config = '{}' THEN
        DELETE FROM dynamic_configs WHERE resource_type = p_type AND resource_name = p_name;
    ELSE
        UPDATE dynamic_configs SET config = p_config, updated_at = now()
         WHERE resource_type = p_type AND resource_name = p_name;
    END IF;
    IF current IS DISTINCT FROM p_config THEN
        PERFORM mink_log_change('dynamic_config_changed', jsonb_build_object(
            'resource_type', p_type, 'resource_name', p_name));
    END IF;
    RETURN 'ok';
END $$;
