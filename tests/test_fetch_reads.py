"""The Fetch handler's reads of several partitions: those going to the object store run at
the same time, and the answer is the one partition-after-partition reading gives (each
partition's budget what is left of the request's max_bytes)."""

from __future__ import annotations

import types

import trio
from kio.schema.errors import ErrorCode

from mink.broker.server.handlers import fetch
from mink.broker.server.handlers.partitions import Located
from mink.storage.log import OffsetOutOfRange


class ColdLog:
    """A log whose every read goes to a slow store; `size` bytes at most per read."""

    def __init__(self, size: int, stats: dict, error=None):
        self.size, self.stats, self.error = size, stats, error
        self.budgets: list[int] = []

    def reads_cold(self, offset: int) -> bool:
        return True

    async def read(self, offset: int, max_bytes: int) -> list[memoryview]:
        self.budgets.append(max_bytes)
        self.stats["now"] += 1
        self.stats["most"] = max(self.stats["most"], self.stats["now"])
        try:
            await trio.sleep(0.05)
        finally:
            self.stats["now"] -= 1
        if self.error is not None:
            raise self.error
        return [memoryview(b"x" * min(self.size, max_bytes))]


def reads_of(logs, partition_max_bytes: int) -> list:
    out = []
    for n, log in enumerate(logs):
        request = types.SimpleNamespace(partition=n, fetch_offset=0,
                                        partition_max_bytes=partition_max_bytes)
        out.append(fetch._Read("t", None, request, Located(ErrorCode.none, log=log)))
    return out


async def test_cold_partitions_are_read_at_once_with_the_budgets_of_one_after_another():
    stats = {"now": 0, "most": 0}
    logs = [ColdLog(100, stats) for _ in range(4)]
    reads = reads_of(logs, 100)
    with trio.fail_after(5):
        total = await fetch._read_all(reads, 1000)
    assert total == 400 and [r.size for r in reads] == [100] * 4
    assert stats["most"] == 4, "the four reads ran at the same time"
    assert [log.budgets for log in logs] == [[100]] * 4, "each partition read once"


async def test_a_request_budget_smaller_than_its_partitions_is_kept_in_order():
    """max_bytes 250 over five partitions of 100, the second in error: the fourth gets 50
    (read after the others with what is left), the fifth nothing; an error stays with its
    partition; no more is read at once than the response holds."""
    stats = {"now": 0, "most": 0}
    logs = [ColdLog(100, stats), ColdLog(100, stats, OffsetOutOfRange("gone")),
            ColdLog(100, stats), ColdLog(100, stats), ColdLog(100, stats)]
    reads = reads_of(logs, 100)
    total = await fetch._read_all(reads, 250)
    assert [r.size for r in reads] == [100, 0, 100, 50, 0]
    assert reads[1].error == ErrorCode.offset_out_of_range
    assert total == 250
    assert [log.budgets for log in logs] == [[100], [100], [100], [50], []]


async def test_one_cold_partition_is_read_as_before():
    stats = {"now": 0, "most": 0}
    hot = ColdLog(100, stats)
    hot.reads_cold = lambda offset: False
    logs = [ColdLog(100, stats), hot]
    reads = reads_of(logs, 100)
    await fetch._read_all(reads, 1000)
    assert stats["most"] == 1 and [log.budgets for log in logs] == [[100], [100]]


async def test_reads_at_once_are_bounded_by_the_response_and_in_number(monkeypatch):
    """No more read at once than the response can hold (max_bytes), nor more partitions
    than COLD_PARTITIONS_AT_ONCE."""
    monkeypatch.setattr(fetch, "COLD_PARTITIONS_AT_ONCE", 3)
    stats = {"now": 0, "most": 0}
    logs = [ColdLog(100, stats) for _ in range(10)]
    await fetch._read_all(reads_of(logs, 100), 10_000)
    assert stats["most"] == 3
    stats = {"now": 0, "most": 0}
    logs = [ColdLog(100, stats) for _ in range(10)]
    reads = reads_of(logs, 100)
    await fetch._read_all(reads, 350)
    assert [len(log.budgets) for log in logs] == [1, 1, 1, 2, 0, 0, 0, 0, 0, 0]
    assert [r.size for r in reads] == [100, 100, 100, 50] + [0] * 6
