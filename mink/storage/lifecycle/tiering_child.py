"""Tiering's copy on file://, in child processes that run at idle CPU priority.

A stream object on file:// is walked (its rows' batch headers read for the footer) and
composed (its bytes copied from the WAL objects) on the node's own CPU. In a worker thread
of the node that work shares the node's two cores, and its GIL, with the leader's commits:
their append-to-durable p99 rose about 3 ms while rounds ran; the same work in a child
process about 2, and in a child under SCHED_IDLE, which gets a core only when nothing else
wants it, about 1 (benchmarks/results/tiering-commit-latency-child-20261207.md). The node's
part of a job (begin, the pace, the swap) stays where it was: only the copy moved.

`TieringChildren` (the node's side) keeps a child per job running at once and sends each a
`Job`; the child (`tiering_child_main.py`, run as `python -m
mink.storage.lifecycle.tiering_child_main PARENT_PID`) answers one
`Outcome` per job, in msgpack frames of a 4-byte length on its stdin and stdout. A child
whose job was cancelled, timed out or failed to answer is killed, not reused; a child exits
within a fraction of a second of its node, even with the cores busy (its watch is a
compiled thread that needs no GIL), so a node killed mid-round leaves no copy running. A
child's unfinished object is a temporary file (`.mink-tmp-*`) that never became an object,
and an object it finished after its node died is an upload the sweep deletes.
"""

from __future__ import annotations

import logging
import math
import os
import struct
import subprocess
import sys

import msgspec
import trio

from mink.storage.objectstore.base import (
    ObjectNotFound,
    ObjectStoreConfigError,
    ObjectStoreError,
    ObjectStoreUnavailable,
)
from mink.storage.objectstore.instrumented import Observe
from mink.storage.stream_object import StreamObjectError

log = logging.getLogger(__name__)

LENGTH = struct.Struct(">I")
# How long a child may take to start and answer its first hello.
START_TIMEOUT_S = 30.0
RETRY_CHILDREN_AFTER_S = 60.0  # after a child could not be started


class Job(msgspec.Struct, array_like=True):
    """One stream object: walk `rows` (object key, byte start, byte end, base offset, last
    offset) of the store at `root`, compose the object `key`, `bytes_per_s` its pace (0:
    as fast as it goes)."""

    root: str
    fsync: bool
    direct: bool
    key: str
    topic_id: str
    partition: int
    index_interval: int
    bytes_per_s: float
    rows: list[tuple[str, int, int, int, int]]


class Outcome(msgspec.Struct, array_like=True):
    """The object's offsets and data length, or the error (`error`: a class name of
    ERRORS) that the same work in the node would have raised. `operations`: the store
    operations it made as the node's metrics count them, (operation, seconds, failed):
    the walk one "get", the copy one "create"."""

    base_offset: int = -1
    last_offset: int = -1
    data_length: int = 0
    error: str = ""
    message: str = ""
    operations: list[tuple[str, float, bool]] = msgspec.field(default_factory=list)


class Refused(Exception):
    """The WAL ranges are not what the index rows say (tiering's TieringRefused)."""


ERRORS: dict[str, type[Exception]] = {cls.__name__: cls for cls in (
    Refused, StreamObjectError, ObjectNotFound, ObjectStoreUnavailable,
    ObjectStoreConfigError, ObjectStoreError)}


def frame(message: msgspec.Struct) -> bytes:
    """`message` as the pipes carry it: a 4-byte length, then msgpack."""
    body = msgspec.msgpack.encode(message)
    return LENGTH.pack(len(body)) + body


# -- the node's side -------------------------------------------------------------------------

class _Child:
    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self._buffer = bytearray()
        self._decoder = msgspec.msgpack.Decoder(Outcome)

    @classmethod
    async def start(cls) -> _Child:
        # The child imports this copy of mink, however the node found it.
        home = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
            os.path.abspath(__file__)))))
        path = os.pathsep.join(p for p in (home, os.environ.get("PYTHONPATH")) if p)
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "mink.storage.lifecycle.tiering_child_main",
             str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": path})
        child = cls(process)
        try:
            with trio.fail_after(START_TIMEOUT_S):
                await child._receive()  # its hello
        except BaseException:
            await child.kill()
            raise
        return child

    async def _receive(self) -> Outcome:
        while True:
            if len(self._buffer) >= LENGTH.size:
                n = LENGTH.unpack_from(self._buffer)[0]
                if len(self._buffer) >= LENGTH.size + n:
                    body = bytes(self._buffer[LENGTH.size:LENGTH.size + n])
                    del self._buffer[:LENGTH.size + n]
                    return self._decoder.decode(body)
            data = await self.process.stdout.receive_some(1 << 16)
            if not data:
                raise ObjectStoreError(f"tiering child {self.process.pid} exited "
                                       f"({self.process.poll()})")
            self._buffer += data

    async def call(self, job: Job) -> Outcome:
        await self.process.stdin.send_all(frame(job))
        return await self._receive()

    async def kill(self) -> None:
        with trio.CancelScope(shield=True):
            self.process.kill()
            await self.process.wait()
            for pipe in (self.process.stdin, self.process.stdout):
                if pipe is not None:
                    await pipe.aclose()


class TieringChildren:
    """The node's tiering children: one per job running at once, started when a job
    needs one, kept between jobs, killed by `aclose` (the tiering worker's exit)."""

    def __init__(self) -> None:
        self._idle: list[_Child] = []
        self._closed = False
        # Until then (after a child could not be started) tiering copies in the node's
        # threads; then children are tried again, so that a moment of overload does not
        # cost the node its idle-priority copies for the rest of its life.
        self._broken_until = -math.inf

    async def __aenter__(self) -> TieringChildren:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def run(self, job: Job, observed: Observe | None = None) -> Outcome:
        """The job's outcome from a child; raises the store's or the walk's error as the
        job in the node would (Refused for TieringRefused). `observed(operation, seconds,
        failed)` is told the store operations the child made, as the node's metrics count
        them (an InstrumentedObjectStore's `observe`)."""
        child = self._idle.pop() if self._idle else None
        if child is None:
            try:
                child = await _Child.start()
            except (OSError, trio.TooSlowError, ObjectStoreError) as exc:
                # this job fails; the next ones copy in the node for a while
                self._broken_until = trio.current_time() + RETRY_CHILDREN_AFTER_S
                log.warning("tiering copies in the node's threads for %.0f s: no child "
                            "process (%r)", RETRY_CHILDREN_AFTER_S, exc)
                raise ObjectStoreError(f"no tiering child process: {exc!r}") from exc
        answered = False
        try:
            outcome = await child.call(job)
            answered = True
        finally:
            if answered and not self._closed:
                self._idle.append(child)
            else:  # cancelled mid-job, or it died: what it is doing is unknown
                await child.kill()
        if observed is not None:
            for operation, seconds, failed in outcome.operations:
                observed(operation, seconds, failed)
        if outcome.error:
            raise ERRORS.get(outcome.error, ObjectStoreError)(outcome.message)
        return outcome

    @property
    def broken(self) -> bool:
        """True for a while after a child could not be started: copy in the node."""
        return trio.current_time() < self._broken_until

    def pids(self) -> list[int]:
        return [c.process.pid for c in self._idle]

    async def aclose(self) -> None:
        self._closed = True
        while self._idle:
            await self._idle.pop().kill()


