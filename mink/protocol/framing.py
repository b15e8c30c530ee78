"""Kafka framing: every request and response is an int32 size followed by that many bytes.

A sans-IO reader: feed it bytes as they arrive, take whole frames out. The size is checked
before anything of the frame is buffered, so a client cannot make the node allocate more
than `max_frame_bytes` by announcing a huge frame.
"""

from __future__ import annotations

import collections
import struct

_SIZE = struct.Struct(">i")
DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024  # socket.request.max.bytes


class FrameError(Exception):
    """The peer sent something that is not a Kafka frame; the connection must be closed."""


class FrameReader:
    """Frames out of a byte stream, with as few copies as a socket allows.

    Bytes come in two ways: `receive_buffer()` hands out the memory the next bytes should
    go to and `received(n)` says how many went there (a socket's `recv_into`), or `feed(data)`
    copies bytes received elsewhere. Small frames share one reused buffer and are copied
    out of it; a frame of `LARGE_FRAME` bytes or more, once its size is known, is received
    into a bytearray of its own that becomes the frame: a Produce's batches are read from
    the socket straight into the memory they are validated, patched and written from.

    Frames are bytearrays: the Produce decoder hands out writable views of them.
    """

    BUFFER_BYTES = 64 * 1024
    LARGE_FRAME = 16 * 1024  # at most BUFFER_BYTES - 4: any smaller frame fits the buffer
    # A frame's own buffer is allocated when its size is read, so only up to this size: a
    # larger one (rare: a Produce is about a MiB) grows the shared buffer as its bytes
    # arrive, and a client announcing a huge frame costs only the bytes it sends.
    EAGER_FRAME = 8 * 1024 * 1024

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES):
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray(self.BUFFER_BYTES)
        self._view = memoryview(self._buffer)
        self._start = 0  # the first byte not taken yet
        self._end = 0  # the end of the bytes received into the buffer
        self._frame: bytearray | None = None  # a large frame being received into its own
        self._filled = 0  # bytes of _frame received
        # Large frames received whole, in order; they come before what the buffer holds.
        self._ready: collections.deque[bytearray] = collections.deque()

    def receive_buffer(self) -> memoryview:
        """Where the next bytes go: never empty, at most what completes a large frame."""
        if self._frame is None:
            self._take_large()
        if self._frame is not None:
            return memoryview(self._frame)[self._filled:]
        if self._end == len(self._buffer):
            left = self._end - self._start
            if left == len(self._buffer):
                # Whole frames not taken yet (feed() of much at once): room for more.
                self._buffer = self._buffer + bytes(len(self._buffer))
                self._view = memoryview(self._buffer)
            else:
                self._view[:left] = self._view[self._start:self._end]
                self._start, self._end = 0, left
        return self._view[self._end:]

    def received(self, count: int) -> None:
        if self._frame is not None:
            self._filled += count
            if self._filled == len(self._frame):
                self._ready.append(self._frame)
                self._frame = None
        else:
            self._end += count

    def feed(self, data) -> None:
        data = memoryview(data)
        while data.nbytes:
            target = self.receive_buffer()
            count = min(target.nbytes, data.nbytes)
            target[:count] = data[:count]
            self.received(count)
            data = data[count:]

    def wanted(self) -> int:
        """How many more bytes complete the next frame (at least 1 when it is incomplete)."""
        if self._ready:
            return 0
        if self._frame is not None:
            return max(1, len(self._frame) - self._filled)
        available = self._end - self._start
        if available < 4:
            return 4 - available
        (size,) = _SIZE.unpack_from(self._buffer, self._start)
        return max(0, 4 + size - available)

    def next_frame(self) -> bytearray | None:
        """The next whole frame without its size prefix, or None until more bytes arrive."""
        if self._ready:
            return self._ready.popleft()
        if self._frame is not None:
            return None
        available = self._end - self._start
        if available < 4:
            self._rewind_if_empty()
            return None
        size = self._size()
        if available < 4 + size:
            return None
        start = self._start + 4
        frame = bytearray(self._view[start:start + size])
        self._start = start + size
        self._rewind_if_empty()
        return frame

    def _size(self) -> int:
        (size,) = _SIZE.unpack_from(self._buffer, self._start)
        if size < 0:
            raise FrameError(f"negative frame size {size}")
        if size > self.max_frame_bytes:
            raise FrameError(
                f"frame of {size} bytes is over socket.request.max.bytes ({self.max_frame_bytes})"
            )
        return size

    def _take_large(self) -> None:
        """Move a large frame whose size is known and that is not all here yet into a
        buffer of its own. An invalid size is left for next_frame to raise."""
        available = self._end - self._start
        if available < 4:
            return
        (size,) = _SIZE.unpack_from(self._buffer, self._start)
        if not self.LARGE_FRAME <= size <= min(self.max_frame_bytes, self.EAGER_FRAME) or (
                available >= 4 + size):
            return
        frame = bytearray(size)
        have = available - 4
        frame[:have] = self._view[self._start + 4:self._end]
        self._frame, self._filled = frame, have
        self._start = self._end = 0

    def _rewind_if_empty(self) -> None:
        if self._start == self._end:
            self._start = self._end = 0
            if len(self._buffer) > self.BUFFER_BYTES:  # grown for a frame over EAGER_FRAME
                self._buffer = bytearray(self.BUFFER_BYTES)
                self._view = memoryview(self._buffer)


def frame(payload: bytes) -> bytes:
    return _SIZE.pack(len(payload)) + payload


def size_prefix(size: int) -> bytes:
    return _SIZE.pack(size)
