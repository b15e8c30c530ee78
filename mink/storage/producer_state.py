"""Idempotent producers: per partition, each producer's epoch and its last five batches,
checked as Kafka's `ProducerStateManager` / `ProducerAppendInfo` do.

Transactional producers add, per producer, the first offset of its ongoing transaction in the
partition (Kafka's `currentTxnFirstOffset`: the last stable offset is the least of them) and
the markers (control batches) that end it; an abort's range goes to the aborted-transaction
index. Those facts ride in the stored state's header, read by PostgreSQL in the WAL commit's
own transaction (`sql/0012_transactions.sql`), so they are durable exactly with the batches.
A transactional batch that does not continue an ongoing transaction is appended only after
verification (KIP-890 part 1): `verified` holds the producers whose partition the
transaction coordinator's state in PostgreSQL lists; a marker clears it.

Two views are kept: `committed` (what PostgreSQL has, written with each WAL commit in the
same transaction) and `current` (committed plus the appends still waiting for their
commit). Checks run against `current`, so a retry of a batch that is still in flight is
recognised and waits for that batch instead of being written twice; a failed commit
rebuilds `current` from `committed` and the appends that survive.
"""

from __future__ import annotations

import collections
import copy
import struct
import time
from dataclasses import dataclass, field

import msgspec

MAX_BATCHES = 5  # Kafka keeps the metadata of the last five batches per producer
NO_EPOCH = -1
NO_OFFSET = -1
COMMIT, ABORT = "commit", "abort"  # the two control (marker) kinds
DEFAULT_EXPIRATION_MS = 24 * 3600 * 1000  # producer.id.expiration.ms


class ProducerError(Exception):
    """A batch the producer state refuses; `kind` names the Kafka error."""

    def __init__(self, kind: str, message: str, expected_seq: int | None = None):
        super().__init__(message)
        # "invalid_producer_epoch" | "out_of_order_sequence_number" | "invalid_txn_state"
        self.kind = kind
        # For a batch of the current epoch that skips sequences: the one that was due.
        self.expected_seq = expected_seq


@dataclass(slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    base_offset: int
    last_offset: int
    # The append waiting for its commit; None once committed (or when loaded).
    pending: object | None = None


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int = NO_EPOCH
    batches: collections.deque = field(
        default_factory=lambda: collections.deque(maxlen=MAX_BATCHES))
    last_update_ms: int = 0
    # The first offset of its ongoing transaction in this partition, NO_OFFSET when none.
    txn_first_offset: int = NO_OFFSET
    # Only in the current view: a marker, and the aborts it ended, not yet known durable.
    marker_pending: bool = False
    aborts_pending: list = field(default_factory=list)  # [(first offset, marker offset)]

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1

    def find_duplicate(self, epoch: int, first_seq: int, last_seq: int) -> BatchMetadata | None:
        if epoch != self.epoch:
            return None
        for batch in self.batches:
            if batch.first_seq == first_seq and batch.last_seq == last_seq:
                return batch
        return None


class _Stored(msgspec.Struct, array_like=True):
    """The bytes stored in PostgreSQL for one producer."""

    epoch: int
    batches: list[tuple[int, int, int, int]]
    last_update_ms: int


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(_Stored)
# The transactional header (read by mink_producer_state_txn in sql/0012_transactions.sql):
# magic, flags, ongoing transaction's first offset, count of aborts, then (first, last) each.
TXN_MAGIC = b"MKT1"
_TXN_HEADER = struct.Struct(">4sBqi")
_ABORT = struct.Struct(">qq")
FLAG_MARKER = 1


def encode_entry(entry: ProducerEntry) -> bytes:
    body = _encoder.encode(_Stored(entry.epoch, [
        (b.first_seq, b.last_seq, b.base_offset, b.last_offset) for b in entry.batches],
        entry.last_update_ms))
    if entry.txn_first_offset == NO_OFFSET and not entry.marker_pending:
        return body  # an idempotent producer's state, as before transactions
    header = _TXN_HEADER.pack(TXN_MAGIC, FLAG_MARKER if entry.marker_pending else 0,
                              entry.txn_first_offset, len(entry.aborts_pending))
    return b"".join([header, *(_ABORT.pack(*a) for a in entry.aborts_pending), body])


def decode_entry(producer_id: int, data: bytes) -> ProducerEntry:
    txn_first_offset = NO_OFFSET
    if data[:4] == TXN_MAGIC:
        _, _, txn_first_offset, count = _TXN_HEADER.unpack_from(data)
        data = data[_TXN_HEADER.size + count * _ABORT.size:]  # the aborts are in PostgreSQL
    stored = _decoder.decode(data)
    entry = ProducerEntry(producer_id, stored.epoch, last_update_ms=stored.last_update_ms,
                          txn_first_offset=txn_first_offset)
    for first_seq, last_seq, base_offset, last_offset in stored.batches:
        entry.batches.append(BatchMetadata(first_seq, last_seq, base_offset, last_offset))
    return entry


def in_sequence(last_seq: int, next_seq: int) -> bool:
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == 2**31 - 1)


@dataclass(slots=True)
class ProducerAppend:
    """What one batch adds to a producer's state; kept on the pending append."""

    producer_id: int
    epoch: int
    first_seq: int
    last_seq: int
    transactional: bool = False
    control: str | None = None  # COMMIT or ABORT: a marker, written by the partition's leader


@dataclass(slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int  # the abort marker's offset


class ProducerStateManager:
    def __init__(self, expiration_ms: int = DEFAULT_EXPIRATION_MS):
        self.expiration_ms = expiration_ms
        self.committed: dict[int, ProducerEntry] = {}
        self.current: dict[int, ProducerEntry] = {}
        # Committed view: producer id -> first offset of its ongoing transaction.
        self.ongoing: dict[int, int] = {}
        # Aborts committed since the partition was opened (the older ones are in PostgreSQL).
        self.new_aborts: list[AbortedTxn] = []
        # Producers whose next transactional batch the coordinator's state allows (KIP-890).
        self.verified: dict[int, int] = {}  # producer id -> epoch
        # Verifications under way: a marker appended meanwhile removes the guard, so that an
        # answer read before the decision cannot let a batch in after its marker.
        self.guards: dict[int, object] = {}

    def load(self, entries: list[ProducerEntry]) -> None:
        self.committed = {e.producer_id: e for e in entries}
        self.current = copy.deepcopy(self.committed)
        self.ongoing = {e.producer_id: e.txn_first_offset for e in entries
                        if e.txn_first_offset != NO_OFFSET}

    def first_unstable_offset(self) -> int | None:
        """The first offset of the oldest committed ongoing transaction (None: none open)."""
        return min(self.ongoing.values()) if self.ongoing else None

    def in_transaction(self, producer_id: int, epoch: int) -> bool:
        """Whether this producer's next transactional batch continues its ongoing
        transaction here (current view), so needs no verification."""
        entry = self.current.get(producer_id)
        return (entry is not None and entry.epoch == epoch
                and entry.txn_first_offset != NO_OFFSET)

    def _live_entry(self, producer_id: int, now_ms: int) -> ProducerEntry | None:
        entry = self.current.get(producer_id)
        if entry is not None and now_ms - entry.last_update_ms > self.expiration_ms and not (
                any(b.pending is not None for b in entry.batches)) and (
                entry.txn_first_offset == NO_OFFSET and not entry.marker_pending):
            # Idle longer than producer.id.expiration.ms: forgotten, as Kafka expires it.
            del self.current[producer_id]
            self.committed.pop(producer_id, None)
            return None
        return entry

    def check(self, append: ProducerAppend) -> BatchMetadata | None:
        """A duplicate of a recent batch (its metadata), None for a new batch in sequence;
        raises ProducerError for a batch Kafka would refuse."""
        now_ms = int(time.time() * 1000)
        entry = self._live_entry(append.producer_id, now_ms)
        if append.control is not None:
            return None  # a marker of the coordinator's decision is always written
        if entry is None or entry.epoch == NO_EPOCH:
            self._check_transaction(append, entry)
            return None  # an unknown producer may start at any sequence (Kafka 2.5+)
        duplicate = entry.find_duplicate(append.epoch, append.first_seq, append.last_seq)
        if duplicate is not None:
            return duplicate
        if append.epoch < entry.epoch:
            raise ProducerError("invalid_producer_epoch",
                                f"producer {append.producer_id} epoch {append.epoch} is older "
                                f"than {entry.epoch}")
        if append.epoch > entry.epoch:
            if append.first_seq != 0:
                raise ProducerError("out_of_order_sequence_number",
                                    f"a new epoch {append.epoch} of producer "
                                    f"{append.producer_id} must start at sequence 0, "
                                    f"not {append.first_seq}")
        elif not in_sequence(entry.last_seq, append.first_seq):
            raise ProducerError("out_of_order_sequence_number",
                                f"producer {append.producer_id}: sequence {append.first_seq} "
                                f"does not follow {entry.last_seq}",
                                expected_seq=entry.last_seq + 1)
        self._check_transaction(append, entry)
        return None

    def _check_transaction(self, append: ProducerAppend, entry: ProducerEntry | None) -> None:
        """KIP-890 part 1: a transactional batch continues the producer's ongoing transaction
        here, or was verified against the coordinator's state since the last marker."""
        if not append.transactional:
            return
        if entry is not None and entry.epoch == append.epoch and (
                entry.txn_first_offset != NO_OFFSET):
            return
        if self.verified.get(append.producer_id) == append.epoch:
            return
        raise ProducerError("invalid_txn_state",
                            f"producer {append.producer_id} epoch {append.epoch} has no "
                            f"ongoing transaction with this partition")

    @staticmethod
    def _apply(entries: dict[int, ProducerEntry], append: ProducerAppend, base_offset: int,
               last_offset: int, pending: object, current: bool) -> ProducerEntry:
        """The state after one accepted append (a batch or a marker), in one view."""
        entry = entries.get(append.producer_id)
        if append.control is not None:
            # Kafka's appendEndTxnMarker: the marker's epoch (perhaps bumped by the
            # coordinator, fencing the old one) becomes the producer's; its transaction here
            # ends, and an abort's range joins the aborted-transaction index.
            if entry is None:
                entry = ProducerEntry(append.producer_id, append.epoch)
                entries[append.producer_id] = entry
            elif append.epoch > entry.epoch:
                entry.epoch = append.epoch
                entry.batches.clear()
            if current:
                if append.control == ABORT and entry.txn_first_offset != NO_OFFSET:
                    entry.aborts_pending.append((entry.txn_first_offset, base_offset))
                entry.marker_pending = True
            entry.txn_first_offset = NO_OFFSET
            entry.last_update_ms = int(time.time() * 1000)
            return entry
        if entry is None or entry.epoch != append.epoch:
            previous = entry
            entry = ProducerEntry(append.producer_id, append.epoch)
            if previous is not None and current:
                entry.marker_pending = previous.marker_pending
                entry.aborts_pending = previous.aborts_pending
            entries[append.producer_id] = entry
        entry.batches.append(BatchMetadata(append.first_seq, append.last_seq, base_offset,
                                           last_offset, pending if current else None))
        if append.transactional and entry.txn_first_offset == NO_OFFSET:
            entry.txn_first_offset = base_offset
        entry.last_update_ms = int(time.time() * 1000)
        return entry

    def record(self, append: ProducerAppend, base_offset: int, last_offset: int,
               pending: object) -> bytes:
        """Apply an accepted batch to the current view; returns the entry's stored form
        after it, to be committed with the batch."""
        if append.transactional or append.control is not None:
            self.verified.pop(append.producer_id, None)
        if append.control is not None:
            self.guards.pop(append.producer_id, None)
        entry = self._apply(self.current, append, base_offset, last_offset, pending, True)
        return encode_entry(entry)

    def commit(self, append: ProducerAppend, base_offset: int, last_offset: int) -> None:
        """The batch is durable: the committed view takes it, the current one forgets its
        pending append."""
        committed = self.committed.get(append.producer_id)
        if append.control == ABORT and committed is not None and (
                committed.txn_first_offset != NO_OFFSET):
            self.new_aborts.append(AbortedTxn(append.producer_id, committed.txn_first_offset,
                                              base_offset))
        entry = self._apply(self.committed, append, base_offset, last_offset, None, False)
        if entry.txn_first_offset != NO_OFFSET:
            self.ongoing[append.producer_id] = entry.txn_first_offset
        else:
            self.ongoing.pop(append.producer_id, None)
        current = self.current.get(append.producer_id)
        if current is not None:
            for batch in current.batches:
                if batch.base_offset == base_offset:
                    batch.pending = None
            if append.control is not None:
                # Durable now, and PostgreSQL took its marker row and aborts with it.
                current.marker_pending = False
                current.aborts_pending = [a for a in current.aborts_pending
                                          if a[1] > last_offset]

    def rebuild(self, surviving: list[tuple[ProducerAppend, int, int, object]]) -> None:
        """After a failed commit: committed state plus the appends still pending."""
        self.current = copy.deepcopy(self.committed)
        for append, base_offset, last_offset, pending in surviving:
            self.record(append, base_offset, last_offset, pending)


class RefusedSequences:
    """Per partition and idempotent producer, the lowest sequence this node answered as not
    written (a retriable error: not leading, closed, frozen, a failed upload or commit),
    until a batch of that producer is accepted there. Node-wide, so it outlives a partition
    reopened at a new leader epoch and a re-registration.

    A batch that skips sequences is answered OUT_OF_ORDER_SEQUENCE_NUMBER, as Kafka does.
    But when the skipped batch is one this node itself refused a moment ago (the batch was
    pipelined behind it), librdkafka takes OUT_OF_ORDER_SEQUENCE_NUMBER on a batch behind
    the head as a reason to bump its epoch and renumber every queued message, and so sends
    batches of *other* partitions that may already be written again as new ones:
    duplicates (confluentinc/librdkafka#4953). A gap this node made is answered with the
    retriable error instead, so the client re-sends the missing batch first, in order."""

    MAX_ENTRIES = 65536
    TTL_S = 600.0  # longer than any client's delivery timeout (Kafka's default is 120 s)

    def __init__(self) -> None:
        # (topic id, partition, producer id) -> (epoch, lowest refused sequence, when)
        self._entries: collections.OrderedDict[tuple, tuple[int, int, float]] = (
            collections.OrderedDict())

    def __len__(self) -> int:
        return len(self._entries)

    def refused(self, topic_id, partition: int, append: ProducerAppend) -> None:
        key = (topic_id, partition, append.producer_id)
        now = time.monotonic()
        old = self._entries.pop(key, None)
        if (old is not None and old[0] == append.epoch and old[1] <= append.first_seq
                and now - old[2] < self.TTL_S):
            self._entries[key] = old
        else:
            self._entries[key] = (append.epoch, append.first_seq, now)
        while len(self._entries) > self.MAX_ENTRIES:
            self._entries.popitem(last=False)

    def explains_gap(self, topic_id, partition: int, append: ProducerAppend,
                     expected_seq: int) -> bool:
        """Whether the sequences `append` skips start at one this node refused."""
        entry = self._entries.get((topic_id, partition, append.producer_id))
        if entry is None:
            return False
        epoch, first_refused, when = entry
        return (epoch == append.epoch and time.monotonic() - when < self.TTL_S
                and first_refused <= expected_seq < append.first_seq)

    def accepted(self, topic_id, partition: int, producer_id: int) -> None:
        if self._entries:
            self._entries.pop((topic_id, partition, producer_id), None)
