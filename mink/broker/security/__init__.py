"""Room for security (round 2): listeners and their security protocols, TLS, SASL
authentication (PLAIN, SCRAM-SHA-256/512) and the authorizer (ACLs from PostgreSQL, through
the view). Empty until that work lands."""
