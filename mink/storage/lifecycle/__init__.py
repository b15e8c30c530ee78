"""Room for the storage lifecycle (round 2): retention by time and size, DeleteRecords,
tiering of WAL objects into per-partition stream objects, and collection of what no index
row references. Every rewrite swaps exact index rows in one transaction: `store.py`
(retention, DeleteRecords, collection), `tiering.py` (WAL objects into stream objects)."""
