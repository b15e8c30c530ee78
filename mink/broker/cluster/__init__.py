"""The cluster (seeds 000 and 001): `membership` this node's registration, renewal and
self-fencing; `sync` the stream-state table of seed 000 ("opening a bucket", pure) and the
loop that applies it to the view; `view` is this node's copy of the shared metadata,
`coordinator` the cluster coordinator (lease, tick, orphan moves, rebalance, lifecycle loops
it schedules), `leases` seed 001's writer and partition leases."""
