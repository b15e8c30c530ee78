"""What read_committed consumers are given: data below the last stable offset, and the
aborted transactions of the range returned (Fetch isolation_level=1), as Kafka's
`LogSegment.collectAbortedTxns` / `Log.read(isolation=TXN_COMMITTED)`.

The aborted-transaction index is in PostgreSQL (`aborted_transactions`, written in the WAL
commit of each abort marker); a partition's leader reads it once, at the first
read_committed fetch after it opened the partition, and adds the aborts it commits itself
(`ProducerStateManager.new_aborts`). A replica view (a node serving a partition another node
leads, mink/storage/replica.py) commits nothing itself: it reads the index again once its
end moved past the end it had when it last read it.
"""

from __future__ import annotations

import struct
import weakref

from mink.storage.controlplane import MetadataError
from mink.storage.log import PartitionLog, StorageUnavailable
from mink.storage.producer_state import AbortedTxn
from mink.storage.replica import ReplicaView

READ_COMMITTED = 1
_POSITION = struct.Struct(">qi")  # baseOffset, batchLength

# PartitionLog -> the aborts PostgreSQL had when this node first needed them, and the log's
# committed end then (every abort marker below it was in the index by then).
_loaded: weakref.WeakKeyDictionary[PartitionLog, tuple[list[AbortedTxn], int]] = (
    weakref.WeakKeyDictionary())


def below_stable_offset(views: list[memoryview], last_stable_offset: int
                        ) -> list[memoryview]:
    """The batches of `views` that start below the LSO (whole batches only)."""
    out = []
    for view in views:
        position, end = 0, len(view)
        while position + 12 <= end:
            base, length = _POSITION.unpack_from(view, position)
            if base >= last_stable_offset:
                break
            position += 12 + length
        if position > 0:
            out.append(view[:position])
        if position < end:
            break
    return out


def any_transactional(views: list[memoryview]) -> bool:
    """Whether a batch in `views` is transactional: only then can an aborted transaction
    concern the range, and only then is the index read (a partition never written in a
    transaction is served from the cache alone, also while PostgreSQL is down)."""
    for view in views:
        position, end = 0, len(view)
        while position + 23 <= end:
            _, length = _POSITION.unpack_from(view, position)
            if view[position + 22] & 0x10:  # attributes (int16 at 21): the transactional bit
                return True
            position += 12 + length
    return False


def last_offset_of(views: list[memoryview]) -> int:
    """The last offset of the batches in `views` (-1 when empty)."""
    last = -1
    for view in views:
        position, end = 0, len(view)
        while position + 27 <= end:
            base, length = _POSITION.unpack_from(view, position)
            (delta,) = struct.unpack_from(">i", view, position + 23)
            last = base + delta
            position += 12 + length
    return last


async def aborted_transactions(store, partition_log: PartitionLog, fetch_offset: int,
                               last_offset: int) -> list[tuple[int, int]]:
    """(producer id, first offset) of the aborted transactions overlapping
    [fetch_offset, last_offset]."""
    if last_offset < fetch_offset:
        return []
    loaded, end_then = _loaded.get(partition_log, (None, -1))
    if loaded is None or (isinstance(partition_log, ReplicaView)
                          and partition_log.committed_end > end_then):
        end_then = partition_log.committed_end  # before the read: its aborts are in it
        try:
            rows = await store.aborted(partition_log.topic_id, partition_log.partition,
                                       partition_log.log_start_offset)
        except MetadataError as exc:
            raise StorageUnavailable(f"reading the aborted-transaction index: {exc}") from exc
        loaded = [AbortedTxn(*row) for row in rows]
        _loaded[partition_log] = (loaded, end_then)
    seen = set()
    out = []
    for txn in (*loaded, *partition_log.producers.new_aborts):
        key = (txn.producer_id, txn.first_offset)
        if key in seen:
            continue
        seen.add(key)
        if txn.first_offset <= last_offset and txn.last_offset >= fetch_offset:
            out.append(key)
    out.sort(key=lambda k: k[1])
    return out
