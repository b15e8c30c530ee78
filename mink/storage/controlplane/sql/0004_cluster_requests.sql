-- Operator requests that only the cluster coordinator may carry out (`mink cluster
-- rebalance`): any client inserts one, the coordinator's next tick executes it and records
-- the result.
CREATE TABLE cluster_requests (
    id           bigserial   PRIMARY KEY,
    kind         text        NOT NULL CHECK (kind IN ('rebalance')),
    requested_at timestamptz NOT NULL DEFAULT now(),
    done_at      timestamptz,
    result       jsonb
);
CREATE INDEX cluster_requests_pending ON cluster_requests (kind, id) WHERE done_at IS NULL;
