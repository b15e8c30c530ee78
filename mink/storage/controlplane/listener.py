"""The change-log listener: LISTEN/NOTIFY on a dedicated connection, used only as a
wake-up (nodes read the change log itself; see `postgres.MetadataStore.listen`)."""

from __future__ import annotations

import trio

class Listener:
    """Async iterator of wake-ups (see MetadataStore.listen)."""

    def __init__(self) -> None:
        self._send, self._recv = trio.open_memory_channel[int | None](1)
        self._connected_event = trio.Event()
        self.connected = False

    def _wake(self, hint: int | None) -> None:
        # called from the asyncio side, in the trio thread: coalesce if one is pending
        try:
            self._send.send_nowait(hint)
        except trio.WouldBlock:
            pass

    def __aiter__(self) -> Listener:
        return self

    async def __anext__(self) -> int | None:
        return await self._recv.receive()

    async def wait(self) -> int | None:
        """The next wake-up."""
        return await self._recv.receive()
