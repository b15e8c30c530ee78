"""The `mink` command: `main` parses and dispatches; `dev` and `serve` run a node; `topics`
and `cluster` are the admin commands (the first through a node's Kafka listener, the second
through the shared PostgreSQL)."""
