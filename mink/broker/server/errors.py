"""Errors at the Kafka listener: storage errors as the Kafka error codes clients act on, and
the one exception a handler raises to close its connection."""

from __future__ import annotations

from kio.schema.errors import ErrorCode

from mink.storage.log import (
    AppendInDoubt,
    InvalidProducerEpoch,
    InvalidTxnState,
    LogError,
    NotLeader,
    OffsetOutOfRange,
    OutOfOrderSequence,
    StorageUnavailable,
)


class CloseConnection(Exception):
    """Raised by a handler when Kafka would close the connection (e.g. a failed acks=0
    Produce)."""


def error_for(exc: LogError) -> ErrorCode:
    if isinstance(exc, NotLeader):
        return ErrorCode.not_leader_or_follower
    if isinstance(exc, AppendInDoubt):
        return ErrorCode.request_timed_out  # may or may not be written: the client decides
    if isinstance(exc, StorageUnavailable):
        return ErrorCode.kafka_storage_error  # retriable, and makes clients refresh metadata
    if isinstance(exc, OffsetOutOfRange):
        return ErrorCode.offset_out_of_range
    if isinstance(exc, InvalidProducerEpoch):
        return ErrorCode.invalid_producer_epoch
    if isinstance(exc, InvalidTxnState):
        return ErrorCode.invalid_txn_state
    if isinstance(exc, OutOfOrderSequence):
        return ErrorCode.out_of_order_sequence_number
    return ErrorCode.unknown_server_error
