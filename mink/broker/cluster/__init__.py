"""The cluster (seeds 000 and 001): `view` is this node's copy of the shared metadata,
`coordinator` the cluster coordinator (lease, tick, orphan moves, rebalance, lifecycle loops
it schedules), `leases` seed 001's writer and partition leases; membership (register, renew,
self-fence) and the stream-state sync live in `mink.broker.node` for now."""
