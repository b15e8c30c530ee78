"""The admin HTTP listener of a node: /metrics (prometheus-client, one registry per node),
/healthz and /readyz for orchestrators' probes. Later: the cluster console, key lookups."""
