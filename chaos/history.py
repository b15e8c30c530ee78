"""The history of a campaign run: one JSON object per line, appended by every worker thread.

Every event has `t` (seconds since the run started, one monotonic clock for the whole run) and
`type`. The types, and the fields the checker reads:

    run         seed, duration, faults, settings              (first line)
    producer    producer, client, idempotent, acks            (a producer session starts)
    send        producer, id, seq                              (seq: order of sends in the session)
    ack         producer, id, partition, offset
    fail        producer, id, error                            (the client gave up on the message)
    read        consumer, partition, offset, id
    commit      consumer, partition, offset, sent              (a successful offset commit; sent:
                                                                when its request was started)
    commit_fail consumer, error
    fault       fault, phase ("start" | "end"), detail
    watermark   partition, low, high                           (before the final read)
    final       partition, offset, id, leader_epoch            (the final read from offset 0)
    final_done  complete (bool), missing (partitions not read up to their high watermark)
    pg_epochs   partition, epochs: [[leader_epoch, start_offset], ...]   (PostgreSQL, after the run)
    pg_range    partition, base, last, node, node_epoch, key             (PostgreSQL, after the run)
    end

A history is written by the campaign and read by the checker; the checker's tests write small
ones by hand.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any


class History:
    """A thread-safe JSON-lines writer. `t` is added to every event."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] = open(path, "w", buffering=1 << 16)
        self._lock = threading.Lock()
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def record(self, type: str, **fields: Any) -> None:
        line = json.dumps({"t": round(self.now(), 4), "type": type, **fields},
                          separators=(",", ":"))
        with self._lock:
            self._file.write(line + "\n")

    def flush(self) -> None:
        with self._lock:
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            self._file.close()


def read_history(path: Path) -> Iterator[dict[str, Any]]:
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                yield json.loads(line)


def write_history(path: Path, events: Iterable[dict[str, Any]]) -> None:
    with open(path, "w") as f:
        for event in events:
            f.write(json.dumps(event) + "\n")
