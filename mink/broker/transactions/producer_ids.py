"""Producer ids for InitProducerId: reserved from PostgreSQL in blocks, never reused.

The next block is reserved in the background once the current one is half used, so that a
PostgreSQL outage does not reach InitProducerId until a whole block has been handed out
meanwhile; a caller that finds both used up waits a bounded time and gets ProducerIdsUnavailable
(answered with a retriable error), never an unbounded wait.
"""

from __future__ import annotations

import logging

import trio

from mink.storage.controlplane import MetadataError

log = logging.getLogger(__name__)

BLOCK_SIZE = 100
WAIT_FOR_BLOCK_S = 2.0  # the longest an InitProducerId waits for a block


class ProducerIdsUnavailable(Exception):
    """No producer id can be handed out now (PostgreSQL unreachable); retriable."""


class ProducerIdBlock:
    def __init__(self, metadata, block_size: int = BLOCK_SIZE,
                 wait_s: float = WAIT_FOR_BLOCK_S):
        self.metadata = metadata
        self.block_size = block_size
        self.wait_s = wait_s
        self._next = 0
        self._end = 0
        self._spare: tuple[int, int] | None = None  # the block reserved ahead
        self._wanted = trio.Event()
        self._fetched = trio.Event()
        self._last_error: Exception | None = None

    async def next_id(self) -> int:
        """A producer id never handed out before. Raises ProducerIdsUnavailable when none can
        be had within wait_s (PostgreSQL is unreachable)."""
        with trio.move_on_after(self.wait_s):
            while True:
                if self._next >= self._end and self._spare is not None:
                    (self._next, self._end), self._spare = self._spare, None
                if self._next < self._end:
                    producer_id = self._next
                    self._next += 1
                    if self._spare is None and self._end - self._next < self.block_size // 2:
                        self._start_fetch()
                    return producer_id
                self._start_fetch()
                await self._fetched.wait()
        raise ProducerIdsUnavailable(f"no producer id block could be reserved: "
                                     f"{self._last_error or 'PostgreSQL did not answer'}")

    def _start_fetch(self) -> None:
        self._wanted.set()

    async def run(self) -> None:
        """Reserve a block whenever one is wanted (the owner runs this in its nursery); the
        first one at once, before any producer asks."""
        self._wanted.set()
        while True:
            await self._wanted.wait()
            self._wanted = trio.Event()
            if self._spare is not None:
                continue
            try:
                first = await self.metadata.allocate_producer_ids(self.block_size)
                self._spare = (first, first + self.block_size)
                self._last_error = None
            except MetadataError as exc:
                log.warning("reserving producer ids failed: %s", exc)
                self._last_error = exc
                await trio.sleep(0.2)  # the next caller asks again
            finally:
                fetched, self._fetched = self._fetched, trio.Event()
                fetched.set()
