"""The tiering child process (`tiering_child.py` has the node's side and the protocol):
`python -m mink.storage.lifecycle.tiering_child_main PARENT_PID` reads `Job`s on stdin and
answers an `Outcome` for each on stdout, under SCHED_IDLE, until its stdin closes or its
parent goes."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import uuid

import msgspec

from mink.storage.lifecycle.tiering import Pace, TieringRefused, WalRow, walk_rows
from mink.storage.lifecycle.tiering_child import (
    ERRORS,
    LENGTH,
    Job,
    Outcome,
    Refused,
    frame,
)
from mink.storage.objectstore.file import FileObjectStore
from mink.storage.objectstore.instrumented import ANSWERS
from mink.storage.stream_object import StreamObjectWriter


def run_job(job: Job) -> Outcome:
    """The job's walk and compose, as a node's `_compose_here` does them, blocking."""
    store = FileObjectStore(job.root, fsync=job.fsync, direct=job.direct)
    writer = StreamObjectWriter(uuid.UUID(job.topic_id), job.partition,
                                index_interval=job.index_interval)
    rows = [WalRow(base, last, key, start, end) for key, start, end, base, last in job.rows]
    operations: list[tuple[str, float, bool]] = []
    try:
        with _timed(operations, "get"):
            store.scan_blocking(lambda read_into: walk_rows(writer, rows, read_into))
        if (writer.base_offset, writer.last_offset) != (rows[0].base_offset,
                                                        rows[-1].last_offset):
            return Outcome(_or_minus_one(writer.base_offset),  # the node refuses it
                           _or_minus_one(writer.last_offset), operations=operations)
        with _timed(operations, "create"):
            store.compose_blocking(job.key, writer.finish(), _throttle(job.bytes_per_s))
    except TieringRefused as exc:
        return Outcome(error=Refused.__name__, message=exc.reason, operations=operations)
    except tuple(ERRORS.values()) as exc:
        return Outcome(error=type(exc).__name__, message=str(exc), operations=operations)
    return Outcome(writer.base_offset, writer.last_offset, writer.data_length,
                   operations=operations)


@contextlib.contextmanager
def _timed(operations: list[tuple[str, float, bool]], operation: str):
    """As the node's InstrumentedObjectStore counts the same call made in the node: its
    time, and failed unless it ended or raised an answer (a missing object, a taken key)."""
    started = time.monotonic()
    failed = True
    try:
        yield
        failed = False
    except ANSWERS:
        failed = False
        raise
    finally:
        operations.append((operation, time.monotonic() - started, failed))


def _or_minus_one(offset: int | None) -> int:
    return -1 if offset is None else offset


def _throttle(bytes_per_s: float):
    """Called after each MiB written, as tiering's Pace.take is: waits until the bytes
    before were due, then books these."""
    if bytes_per_s <= 0:
        return None
    pace = Pace(bytes_per_s)

    def throttle(nbytes: int) -> None:
        now = time.monotonic()
        start = pace.book(nbytes, now)
        if start > now:
            time.sleep(start - now)
    return throttle


def _read_exactly(stream, n: int) -> bytes | None:
    data = stream.read(n)
    return data if data is not None and len(data) == n else None


def _die_with(parent: int) -> None:
    """Exit within a second of the node (`parent`) going, even mid-job, even with the cores
    busy: the compiled watch takes no GIL (_parent_watch.pyx says why that matters); a
    Python thread where it was not built. Not PR_SET_PDEATHSIG: that follows the thread
    that started the child, and trio starts processes from worker threads that end when
    idle. Called before the priority is lowered: the watch keeps the normal one."""
    try:
        from mink.storage.lifecycle._parent_watch import exit_with_parent
    except ImportError:  # pragma: no cover - depends on the build
        exit_with_parent = None
    if exit_with_parent is not None:
        exit_with_parent(parent, 200)
        return

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _lower_priority() -> None:
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (OSError, AttributeError):  # not Linux: the lowest nice instead
        os.nice(19)


def main(argv: list[str]) -> int:
    _die_with(int(argv[1]))
    _lower_priority()
    # The answers go to the node on what was stdout; anything else written there (a
    # library's print) goes to stderr instead of into a frame.
    stdin, stdout = sys.stdin.buffer, os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    stdout.write(frame(Outcome()))  # hello: started and ready
    stdout.flush()
    decoder = msgspec.msgpack.Decoder(Job)
    while True:
        head = _read_exactly(stdin, LENGTH.size)
        if head is None:
            return 0  # the node closed the pipe: done
        body = _read_exactly(stdin, LENGTH.unpack(head)[0])
        if body is None:
            return 0
        stdout.write(frame(run_job(decoder.decode(body))))
        stdout.flush()



if __name__ == "__main__":
    sys.exit(main(sys.argv))
