-- SCRAM credentials (KIP-554): one row per (user, mechanism), salted, never the password.
-- stored_key = H(HMAC(salted_password, "Client Key")), server_key = HMAC(salted_password,
-- "Server Key") (RFC 5802). PLAIN is checked against the same rows
-- (mink/broker/security/authenticator.py). Nodes read a user's row when it authenticates,
-- so a change applies to the next authentication on any node.

CREATE TABLE scram_credentials (
    user_name   text        NOT NULL,
    mechanism   text        NOT NULL CHECK (mechanism IN ('SCRAM-SHA-256', 'SCRAM-SHA-512')),
    salt        bytea       NOT NULL,
    stored_key  bytea       NOT NULL,
    server_key  bytea       NOT NULL,
    iterations  integer     NOT NULL CHECK (iterations > 0),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (user_name, mechanism)
);
