"""Room for compacted topics (round 2): a KV tablet (key digest -> latest offset) per
partition, snapshotted to the object store, restored and replayed on open; compaction
("assembly") under the topic's writer lease. Empty until that work lands."""
