"""The handler time a request costs, for `request_percentage` (KIP-124).

Kafka charges a request the time a request-handler thread spent on it (and the network
thread's time, recorded without throttling). Mink has one event loop and no handler
threads, so it charges the time the event loop spent running the request's handler task:
the sum of that task's steps (decoding the request, the handler's own work, building and
encoding the response), never the time it spent waiting (for the WAL, for PostgreSQL, in a
long poll). Work the handler hands to other tasks (the WAL flush, shared by many requests)
is not charged. 100% is one event loop's whole time.

The steps are timed by a trio instrument, installed only while some request_percentage
quota exists: its hooks run at every task step of the node's trio run, which costs a
little on the hot path.
"""

from __future__ import annotations

import time

import trio

__all__ = ["HandlerTime"]


class HandlerTime(trio.abc.Instrument):
    """Times the steps of the tasks it is told to track."""

    def __init__(self) -> None:
        self._tracked: dict[object, list[float]] = {}  # task -> [seconds, step started]

    def track(self, task: object) -> list[float]:
        entry = self._tracked[task] = [0.0, time.perf_counter()]
        return entry

    def done(self, task: object) -> float:
        """Stop tracking the task; its steps' seconds, the running step up to now included."""
        entry = self._tracked.pop(task, None)
        if entry is None:
            return 0.0
        return entry[0] + (time.perf_counter() - entry[1])

    def before_task_step(self, task) -> None:
        entry = self._tracked.get(task)
        if entry is not None:
            entry[1] = time.perf_counter()

    def after_task_step(self, task) -> None:
        entry = self._tracked.get(task)
        if entry is not None:
            entry[0] += time.perf_counter() - entry[1]
