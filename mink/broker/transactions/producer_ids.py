"""Producer ids for InitProducerId: reserved from PostgreSQL in blocks, never reused."""

from __future__ import annotations

import trio

BLOCK_SIZE = 100


class ProducerIdBlock:
    def __init__(self, metadata, block_size: int = BLOCK_SIZE):
        self.metadata = metadata
        self.block_size = block_size
        self._next = 0
        self._end = 0
        self._lock = trio.Lock()

    async def next_id(self) -> int:
        async with self._lock:
            if self._next >= self._end:
                self._next = await self.metadata.allocate_producer_ids(self.block_size)
                self._end = self._next + self.block_size
            producer_id = self._next
            self._next += 1
            return producer_id
