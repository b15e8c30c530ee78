"""Kafka framing: every request and response is an int32 size followed by that many bytes.

A sans-IO reader: feed it bytes as they arrive, take whole frames out. The size is checked
before anything of the frame is buffered, so a client cannot make the node allocate more
than `max_frame_bytes` by announcing a huge frame.
"""

from __future__ import annotations

import struct

_SIZE = struct.Struct(">i")
DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024  # socket.request.max.bytes


class FrameError(Exception):
    """The peer sent something that is not a Kafka frame; the connection must be closed."""


class FrameReader:
    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES):
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._pos = 0

    def feed(self, data: bytes) -> None:
        if self._pos:
            # Drop consumed bytes before growing, so the buffer stays about one frame long.
            del self._buffer[: self._pos]
            self._pos = 0
        self._buffer += data

    def wanted(self) -> int:
        """How many more bytes complete the next frame (at least 1 when it is incomplete)."""
        available = len(self._buffer) - self._pos
        if available < 4:
            return 4 - available
        (size,) = _SIZE.unpack_from(self._buffer, self._pos)
        return max(0, 4 + size - available)

    def next_frame(self) -> bytes | None:
        """The next whole frame without its size prefix, or None until more bytes arrive."""
        available = len(self._buffer) - self._pos
        if available < 4:
            return None
        (size,) = _SIZE.unpack_from(self._buffer, self._pos)
        if size < 0:
            raise FrameError(f"negative frame size {size}")
        if size > self.max_frame_bytes:
            raise FrameError(
                f"frame of {size} bytes is over socket.request.max.bytes ({self.max_frame_bytes})"
            )
        if available < 4 + size:
            return None
        start = self._pos + 4
        frame = bytes(self._buffer[start : start + size])
        self._pos = start + size
        return frame


def frame(payload: bytes) -> bytes:
    return _SIZE.pack(len(payload)) + payload


def size_prefix(size: int) -> bytes:
    return _SIZE.pack(size)
