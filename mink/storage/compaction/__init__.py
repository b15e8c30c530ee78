"""Compacted topics (docs/compaction.md): the log cleaner's record work (`cleaner.py`) and
its pass over a partition's index rows (`store.py`), the KV tablet (`tablet.py`: key digest
-> latest offset) and its snapshots in the object store (`snapshots.py`). The broker loops
that run them: `mink/broker/cluster/compaction.py` and `mink/broker/cluster/tablets.py`."""
