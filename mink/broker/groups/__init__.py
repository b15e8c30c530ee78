"""Consumer groups (the classic protocol): `state` is Kafka's group state machine with no
I/O, `coordinator` runs the groups of the `__consumer_offsets` partitions this node leads;
their state and committed offsets are stored by `mink.storage.controlplane.groups`."""
