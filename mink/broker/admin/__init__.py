"""Room for the admin HTTP listener (round 2): /metrics (prometheus-client, one registry per
node), health and readiness, the cluster console, key lookups. Empty until that work
lands."""
