-- ACLs (Kafka's AclBinding: a resource pattern and an access control entry), read whole by
-- every node when its view version moves (mink/broker/security/authorizer.py), as quotas
-- are (sql/0015): CreateAcls and DeleteAcls write the table and one change-log row in one
-- transaction, so its NOTIFY brings every node the change within a sync.
--
-- Codes are Kafka's: resource_type 2 TOPIC, 3 GROUP, 4 CLUSTER, 5 TRANSACTIONAL_ID;
-- pattern_type 3 LITERAL, 4 PREFIXED; operation 2 ALL .. 12 IDEMPOTENT_WRITE; permission
-- 2 DENY, 3 ALLOW. The wildcard resource '*' and host '*' are stored as they are sent.

CREATE TABLE acls (
    resource_type   smallint    NOT NULL CHECK (resource_type IN (2, 3, 4, 5)),
    resource_name   text        NOT NULL CHECK (resource_name <> ''),
    pattern_type    smallint    NOT NULL CHECK (pattern_type IN (3, 4)),
    principal       text        NOT NULL,
    host            text        NOT NULL,
    operation       smallint    NOT NULL CHECK (operation BETWEEN 2 AND 12),
    permission_type smallint    NOT NULL CHECK (permission_type IN (2, 3)),
    created_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (resource_type, resource_name, pattern_type, principal, host, operation,
                 permission_type)
);

-- CreateAcls: the bindings (already validated) are inserted, existing ones left as they are
-- (Kafka answers success for a binding that exists). Returns the change-log version.
CREATE FUNCTION mink_create_acls(p_types smallint[], p_names text[], p_patterns smallint[],
                                 p_principals text[], p_hosts text[], p_operations smallint[],
                                 p_permissions smallint[]) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO acls (resource_type, resource_name, pattern_type, principal, host, operation,
                      permission_type)
    SELECT * FROM unnest(p_types, p_names, p_patterns, p_principals, p_hosts, p_operations,
                         p_permissions)
    ON CONFLICT DO NOTHING;
    RETURN mink_log_change('acls_changed', jsonb_build_object('created', cardinality(p_types)));
END $$;

-- DeleteAcls: exact bindings (the node resolved the filters against its copy, re-checked
-- here by the DELETE itself: a binding gone meanwhile is simply not returned). Returns the
-- deleted rows; the change-log row is written only when something was deleted.
CREATE FUNCTION mink_delete_acls(p_types smallint[], p_names text[], p_patterns smallint[],
                                 p_principals text[], p_hosts text[], p_operations smallint[],
                                 p_permissions smallint[])
RETURNS TABLE (resource_type smallint, resource_name text, pattern_type smallint,
               principal text, host text, operation smallint, permission_type smallint)
LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    RETURN QUERY
    DELETE FROM acls AS a
     USING unnest(p_types, p_names, p_patterns, p_principals, p_hosts, p_operations,
                  p_permissions) AS d(t, nm, p, pr, h, o, pe)
     WHERE a.resource_type = d.t AND a.resource_name = d.nm AND a.pattern_type = d.p
       AND a.principal = d.pr AND a.host = d.h AND a.operation = d.o
       AND a.permission_type = d.pe
    RETURNING a.resource_type, a.resource_name, a.pattern_type, a.principal, a.host,
              a.operation, a.permission_type;
    GET DIAGNOSTICS n = ROW_COUNT;
    IF n > 0 THEN
        PERFORM mink_log_change('acls_changed', jsonb_build_object('deleted', n));
    END IF;
END $$;
