-- Client quotas (KIP-13, KIP-55, KIP-546): Kafka's /config/users/... and /config/clients/...
-- entities with their quota values, in one table. Every node reads the whole table when the
-- view version moves (mink/broker/quotas/manager.py), so a change reaches every node with the
-- change-log row and its NOTIFY, as topic settings do.
--
-- An entity is a (user, client-id) pair whose parts are encoded as text, never NULL, so the
-- primary key is plain:
--   ''          the part is absent (a user entity has no client-id part)
--   '*'         the default of that part (Kafka's <default>, an entity_name of null)
--   '=' || name a named part ('=' followed by the name: an empty name is '=')

CREATE TABLE client_quotas (
    user_part   text             NOT NULL,
    client_part text             NOT NULL,
    quota_key   text             NOT NULL,   -- producer_byte_rate, consumer_byte_rate, ...
    value       double precision NOT NULL,
    updated_at  timestamptz      NOT NULL DEFAULT now(),
    PRIMARY KEY (user_part, client_part, quota_key),
    CHECK (user_part <> '' OR client_part <> ''),
    CHECK (user_part = '' OR user_part = '*' OR user_part LIKE '=%'),
    CHECK (client_part = '' OR client_part = '*' OR client_part LIKE '=%')
);

-- One AlterClientQuotas request, already validated (mink/broker/quotas/entities.py): each op
-- sets or removes one key of one entity. All of them in one transaction with one change-log
-- row, so a node never sees half of a request.
CREATE FUNCTION mink_alter_client_quotas(p_user_parts text[], p_client_parts text[],
                                         p_keys text[], p_values double precision[],
                                         p_remove boolean[]) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM client_quotas AS q
     USING unnest(p_user_parts, p_client_parts, p_keys, p_remove) AS o(u, c, k, r)
     WHERE o.r AND q.user_part = o.u AND q.client_part = o.c AND q.quota_key = o.k;
    INSERT INTO client_quotas (user_part, client_part, quota_key, value)
    SELECT o.u, o.c, o.k, o.v
      FROM unnest(p_user_parts, p_client_parts, p_keys, p_values, p_remove) AS o(u, c, k, v, r)
     WHERE NOT o.r
    ON CONFLICT (user_part, client_part, quota_key)
    DO UPDATE SET value = excluded.value, updated_at = now();
    RETURN mink_log_change('client_quotas_changed',
                           jsonb_build_object('ops', cardinality(p_keys)));
END $$;
