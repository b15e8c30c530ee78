"""The transaction state machine, pure: what each request does to a transactional id's state,
as Kafka's TransactionCoordinator decides it (transaction.version 1: the epoch is bumped by
InitProducerId and by aborts the coordinator starts itself, not at every transaction).

Each rule takes the stored state (or None) and the request and returns a `Decision`: the
error to answer and, when something changes, the state to write. The coordinator applies it
with one compare-and-set; the tests of this module are the rows of the rules.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode

EMPTY = "Empty"
ONGOING = "Ongoing"
PREPARE_COMMIT = "PrepareCommit"
PREPARE_ABORT = "PrepareAbort"
COMPLETE_COMMIT = "CompleteCommit"
COMPLETE_ABORT = "CompleteAbort"
PREPARING = (PREPARE_COMMIT, PREPARE_ABORT)
# Every state name Kafka knows (ListTransactions' state filters); Mink never stores the
# last two (it removes an expired id's row instead of Dead; no transaction.version 2 fence).
KAFKA_STATES = frozenset({EMPTY, ONGOING, PREPARE_COMMIT, PREPARE_ABORT, COMPLETE_COMMIT,
                          COMPLETE_ABORT, "Dead", "PrepareEpochFence"})

MAX_EPOCH = 32767  # Short.MaxValue: an epoch that would reach it takes a new producer id
NEW_PRODUCER_ID = -2  # in a Decision: the coordinator hands out a fresh producer id


@dataclass(frozen=True, slots=True)
class Stored:
    """What the rules need of a stored transaction."""
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    state: str
    partitions: frozenset = frozenset()


@dataclass(frozen=True, slots=True)
class Write:
    state: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    add: tuple[tuple[uuid.UUID, int], ...] = ()


@dataclass(frozen=True, slots=True)
class Decision:
    error: ErrorCode
    write: Write | None = None
    # What InitProducerId answers once the write is durable (producer id, epoch).
    answer: tuple[int, int] = field(default=(-1, -1))


def _next_epoch(stored: Stored) -> tuple[int, int]:
    if stored.producer_epoch + 1 >= MAX_EPOCH:
        return NEW_PRODUCER_ID, 0
    return stored.producer_id, stored.producer_epoch + 1


def init_producer_id(stored: Stored | None, timeout_ms: int, producer_id: int = -1,
                     producer_epoch: int = -1) -> Decision:
    """InitProducerId with a transactional id. `producer_id`/`producer_epoch` are what a v3+
    client says it has (KIP-360), -1 when it starts afresh."""
    if stored is None:
        return Decision(ErrorCode.none, Write(EMPTY, NEW_PRODUCER_ID, 0, timeout_ms),
                        (NEW_PRODUCER_ID, 0))
    if stored.state in PREPARING:
        return Decision(ErrorCode.concurrent_transactions)
    if producer_id >= 0 and (producer_id != stored.producer_id
                             or producer_epoch != stored.producer_epoch):
        return Decision(ErrorCode.producer_fenced)
    if stored.state == ONGOING:
        # The previous instance left a transaction open: abort it, with a bumped epoch so
        # that its late writes are fenced; the client retries until it is complete.
        pid, epoch = _next_epoch(stored)
        if pid == NEW_PRODUCER_ID:
            pid, epoch = stored.producer_id, stored.producer_epoch
        return Decision(ErrorCode.concurrent_transactions,
                        Write(PREPARE_ABORT, pid, epoch, stored.timeout_ms))
    pid, epoch = _next_epoch(stored)
    return Decision(ErrorCode.none, Write(EMPTY, pid, epoch, timeout_ms), (pid, epoch))


def _check_producer(stored: Stored | None, producer_id: int,
                    producer_epoch: int) -> ErrorCode | None:
    if stored is None or stored.producer_id != producer_id:
        return ErrorCode.invalid_producer_id_mapping
    if stored.producer_epoch != producer_epoch:
        return ErrorCode.producer_fenced
    return None


def add_partitions(stored: Stored | None, producer_id: int, producer_epoch: int,
                   partitions: set[tuple[uuid.UUID, int]]) -> Decision:
    """AddPartitionsToTxn (and AddOffsetsToTxn, with the group's offsets partition)."""
    error = _check_producer(stored, producer_id, producer_epoch)
    if error is not None:
        return Decision(error)
    if stored.state in PREPARING:
        return Decision(ErrorCode.concurrent_transactions)
    new = tuple(sorted(partitions - stored.partitions)) if stored.state == ONGOING else (
        tuple(sorted(partitions)))
    if stored.state == ONGOING and not new:
        return Decision(ErrorCode.none)
    return Decision(ErrorCode.none, Write(ONGOING, stored.producer_id, stored.producer_epoch,
                                          stored.timeout_ms, new))


def verify_partitions(stored: Stored | None, producer_id: int, producer_epoch: int,
                      partitions: set[tuple[uuid.UUID, int]]) -> ErrorCode:
    """AddPartitionsToTxn v4+ with verify_only: whether every partition is in the ongoing
    transaction."""
    error = _check_producer(stored, producer_id, producer_epoch)
    if error is not None:
        return error
    if stored.state != ONGOING or not partitions <= stored.partitions:
        return ErrorCode.invalid_txn_state
    return ErrorCode.none


def end_txn(stored: Stored | None, producer_id: int, producer_epoch: int,
            commit: bool) -> Decision:
    """EndTxn: answered once PrepareCommit / PrepareAbort is durable; a retry after that
    gets NONE when the outcome is the one asked for."""
    error = _check_producer(stored, producer_id, producer_epoch)
    if error is not None:
        return Decision(error)
    state = stored.state
    if state == ONGOING:
        return Decision(ErrorCode.none, Write(PREPARE_COMMIT if commit else PREPARE_ABORT,
                                              stored.producer_id, stored.producer_epoch,
                                              stored.timeout_ms))
    if (state, commit) in ((COMPLETE_COMMIT, True), (COMPLETE_ABORT, False)):
        return Decision(ErrorCode.none)
    if (state, commit) in ((PREPARE_COMMIT, True), (PREPARE_ABORT, False)):
        return Decision(ErrorCode.concurrent_transactions)
    return Decision(ErrorCode.invalid_txn_state)


def abort_timed_out(stored: Stored | None) -> Decision:
    """The coordinator aborts a transaction open past its timeout, bumping the epoch (the
    producer is fenced, as in Kafka before transaction.version 2)."""
    if stored is None or stored.state != ONGOING:
        return Decision(ErrorCode.none)
    pid, epoch = _next_epoch(stored)
    if pid == NEW_PRODUCER_ID:
        pid, epoch = stored.producer_id, stored.producer_epoch
    return Decision(ErrorCode.none, Write(PREPARE_ABORT, pid, epoch, stored.timeout_ms))
