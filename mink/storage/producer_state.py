"""Idempotent producers: per partition, each producer's epoch and its last five batches,
checked as Kafka's `ProducerStateManager` / `ProducerAppendInfo` do.

Two views are kept: `committed` (what PostgreSQL has, written with each WAL commit in the
same transaction) and `current` (committed plus the appends still waiting for their
commit). Checks run against `current`, so a retry of a batch that is still in flight is
recognised and waits for that batch instead of being written twice; a failed commit
rebuilds `current` from `committed` and the appends that survive.
"""

from __future__ import annotations

import collections
import copy
import time
from dataclasses import dataclass, field

import msgspec

MAX_BATCHES = 5  # Kafka keeps the metadata of the last five batches per producer
NO_EPOCH = -1
DEFAULT_EXPIRATION_MS = 24 * 3600 * 1000  # producer.id.expiration.ms


class ProducerError(Exception):
    """A batch the producer state refuses; `kind` names the Kafka error."""

    def __init__(self, kind: str, message: str, expected_seq: int | None = None):
        super().__init__(message)
        self.kind = kind  # "invalid_producer_epoch" | "out_of_order_sequence_number"
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


def encode_entry(entry: ProducerEntry) -> bytes:
    return _encoder.encode(_Stored(entry.epoch, [
        (b.first_seq, b.last_seq, b.base_offset, b.last_offset) for b in entry.batches],
        entry.last_update_ms))


def decode_entry(producer_id: int, data: bytes) -> ProducerEntry:
    stored = _decoder.decode(data)
    entry = ProducerEntry(producer_id, stored.epoch, last_update_ms=stored.last_update_ms)
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


class ProducerStateManager:
    def __init__(self, expiration_ms: int = DEFAULT_EXPIRATION_MS):
        self.expiration_ms = expiration_ms
        self.committed: dict[int, ProducerEntry] = {}
        self.current: dict[int, ProducerEntry] = {}

    def load(self, entries: list[ProducerEntry]) -> None:
        self.committed = {e.producer_id: e for e in entries}
        self.current = copy.deepcopy(self.committed)

    def _live_entry(self, producer_id: int, now_ms: int) -> ProducerEntry | None:
        entry = self.current.get(producer_id)
        if entry is not None and now_ms - entry.last_update_ms > self.expiration_ms and not (
                any(b.pending is not None for b in entry.batches)):
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
        if entry is None or entry.epoch == NO_EPOCH:
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
        return None

    def record(self, append: ProducerAppend, base_offset: int, last_offset: int,
               pending: object) -> bytes:
        """Apply an accepted batch to the current view; returns the entry's stored form
        after it, to be committed with the batch."""
        entry = self.current.get(append.producer_id)
        if entry is None or entry.epoch != append.epoch:
            entry = ProducerEntry(append.producer_id, append.epoch)
            self.current[append.producer_id] = entry
        entry.batches.append(BatchMetadata(append.first_seq, append.last_seq, base_offset,
                                           last_offset, pending))
        entry.last_update_ms = int(time.time() * 1000)
        return encode_entry(entry)

    def commit(self, append: ProducerAppend, base_offset: int, last_offset: int) -> None:
        """The batch is durable: the committed view takes it, the current one forgets its
        pending append."""
        entry = self.committed.get(append.producer_id)
        if entry is None or entry.epoch != append.epoch:
            entry = ProducerEntry(append.producer_id, append.epoch)
            self.committed[append.producer_id] = entry
        entry.batches.append(BatchMetadata(append.first_seq, append.last_seq, base_offset,
                                           last_offset))
        entry.last_update_ms = int(time.time() * 1000)
        current = self.current.get(append.producer_id)
        if current is not None:
            for batch in current.batches:
                if batch.base_offset == base_offset:
                    batch.pending = None

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
