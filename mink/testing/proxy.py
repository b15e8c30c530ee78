"""A controllable TCP proxy for fault tests: stall, cut, delay or drop the replies of a connection.

Put it between a node and PostgreSQL (or a client and a node) and drive it from the test:

    with TcpProxy("127.0.0.1", pg_port).in_thread() as proxy:
        url = f"postgresql://...@{proxy.address[0]}:{proxy.address[1]}/db"
        ...
        proxy.stall()          # bytes held both ways, connections stay open
        proxy.resume()
        proxy.drop_replies(True)   # upstream -> client bytes thrown away
        proxy.cut()            # every connection closed, new ones reset
        proxy.restore()

The controls are plain methods, safe to call from any thread and from trio. When the proxy runs
in another thread, a control returns only once the proxy's loop has seen it, so a chunk the
proxy receives after `stall()` returned is never forwarded before `resume()`.

Only trio and the standard library are imported: a pytest plugin imports this package.
"""

from __future__ import annotations

import contextlib
import math
import socket
import struct
import threading
from collections.abc import Iterator

import trio

_CHUNK = 65536
_CONTROL_TIMEOUT = 5.0  # a control waits this long for the proxy's loop to see it


class TcpProxy:
    """Forwards TCP connections from (listen_host, listen_port) to (upstream_host, upstream_port)."""

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        listen_host: str = "127.0.0.1",
        listen_port: int = 0,
    ) -> None:
        self.upstream = (upstream_host, upstream_port)
        self._listen = (listen_host, listen_port)
        self._address: tuple[str, int] | None = None
        self._lock = threading.Lock()
        self._stalled = False
        self._cut = False
        self._delay = 0.0
        self._drop_replies = False
        # Set while run() serves; used to hand controls to the proxy's loop.
        self._token: trio.lowlevel.TrioToken | None = None
        self._loop_thread: int | None = None
        self._changed = trio.Event()  # replaced on every control; pumps wait on it
        self._connections: set[trio.CancelScope] = set()
        self._thread_cancel: trio.CancelScope | None = None
        # Counters, for tests that wait until traffic has flowed.
        self.accepted = 0
        self.bytes_to_upstream = 0
        self.bytes_to_client = 0
        self.bytes_dropped = 0

    # -- controls (any thread) --------------------------------------------------------------

    @property
    def address(self) -> tuple[str, int]:
        if self._address is None:
            raise RuntimeError("the proxy is not listening yet")
        return self._address

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    def stall(self) -> None:
        """Stop forwarding both ways; connections stay open and the bytes are held."""
        self._set(stalled=True)

    def resume(self) -> None:
        """Forward again, starting with the held bytes."""
        self._set(stalled=False)

    def cut(self) -> None:
        """Close every current connection and reset new ones until restore()."""
        self._set(cut=True)

    def restore(self) -> None:
        self._set(cut=False)

    def set_delay(self, seconds: float) -> None:
        """Add this much latency to every chunk, each way (0 for none)."""
        if seconds < 0:
            raise ValueError("delay must be >= 0")
        self._set(delay=float(seconds))

    def drop_replies(self, enabled: bool) -> None:
        """While on, bytes from upstream to the client are discarded (requests still pass)."""
        self._set(drop_replies=bool(enabled))

    def _set(self, **changes: object) -> None:
        with self._lock:
            for name, value in changes.items():
                setattr(self, "_" + name, value)
            token = self._token
        if token is None:
            return
        if threading.get_ident() == self._loop_thread:
            self._apply()
            return
        seen = threading.Event()

        def apply_and_signal() -> None:
            try:
                self._apply()
            finally:
                seen.set()

        try:
            token.run_sync_soon(apply_and_signal)
        except trio.RunFinishedError:
            return
        seen.wait(_CONTROL_TIMEOUT)

    def _apply(self) -> None:
        """On the proxy's loop: wake the pumps and, after cut(), close every connection."""
        changed, self._changed = self._changed, trio.Event()
        changed.set()
        if self._cut:
            for scope in list(self._connections):
                scope.cancel()

    # -- serving ----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; reports the (host, port) it listens on."""
        listeners = await trio.open_tcp_listeners(self._listen[1], host=self._listen[0])
        listener = listeners[0]
        for extra in listeners[1:]:
            await extra.aclose()
        host, port = listener.socket.getsockname()[:2]
        self._address = (host, port)
        self._loop_thread = threading.get_ident()
        with self._lock:
            self._token = trio.lowlevel.current_trio_token()
        try:
            async with listener, trio.open_nursery() as nursery:
                task_status.started(self._address)
                while True:
                    stream = await listener.accept()
                    self.accepted += 1
                    if self._cut:
                        _reset(stream)
                        continue
                    nursery.start_soon(self._serve_connection, stream)
        finally:
            with self._lock:
                self._token = None
            self._loop_thread = None

    async def _serve_connection(self, client: trio.SocketStream) -> None:
        scope = trio.CancelScope()
        self._connections.add(scope)
        try:
            with scope:
                try:
                    upstream = await trio.open_tcp_stream(*self.upstream)
                except OSError:
                    _reset(client)
                    return
                try:
                    async with trio.open_nursery() as nursery:
                        for source, target, to_client in ((client, upstream, False), (upstream, client, True)):
                            send, receive = trio.open_memory_channel[tuple[float, bytes]](math.inf)
                            nursery.start_soon(self._read, source, send)
                            nursery.start_soon(self._write, receive, target, to_client, scope)
                finally:
                    _reset(upstream)
        finally:
            self._connections.discard(scope)
            if scope.cancelled_caught or self._cut:
                _reset(client)
            else:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    client.socket.close()

    async def _read(self, source: trio.SocketStream, queue: trio.MemorySendChannel[tuple[float, bytes]]) -> None:
        async with queue:
            while True:
                try:
                    data = await source.receive_some(_CHUNK)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
                await queue.send((trio.current_time(), data))
                if not data:
                    return

    async def _write(
        self,
        queue: trio.MemoryReceiveChannel[tuple[float, bytes]],
        target: trio.SocketStream,
        to_client: bool,
        connection: trio.CancelScope,
    ) -> None:
        async with queue:
            async for received_at, data in queue:
                while True:
                    if self._delay > 0:
                        await trio.sleep_until(received_at + self._delay)
                    if not self._stalled:
                        break
                    await self._changed.wait()
                if not data:  # end of stream one way: the connection ends (no half-close games)
                    connection.cancel()
                    return
                # No await between this check and the send: a stall seen by the loop holds it.
                if to_client and self._drop_replies:
                    self.bytes_dropped += len(data)
                    continue
                try:
                    await target.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    connection.cancel()
                    return
                if to_client:
                    self.bytes_to_client += len(data)
                else:
                    self.bytes_to_upstream += len(data)

    # -- for sync tests ---------------------------------------------------------------------

    @contextlib.contextmanager
    def in_thread(self, timeout: float = 10.0) -> Iterator[TcpProxy]:
        """Run the proxy in a daemon thread with its own trio.run; listening when this returns."""
        listening = threading.Event()
        failure: list[BaseException] = []

        async def main() -> None:
            with trio.CancelScope() as scope:
                self._thread_cancel = scope

                async with trio.open_nursery() as nursery:
                    await nursery.start(self.run)
                    listening.set()

        def thread_main() -> None:
            try:
                trio.run(main)
            except BaseException as exc:  # reported to the test's thread
                failure.append(exc)
                listening.set()

        thread = threading.Thread(target=thread_main, name="mink-tcp-proxy", daemon=True)
        thread.start()
        if not listening.wait(timeout):
            raise RuntimeError("the proxy did not start listening")
        if failure:
            raise RuntimeError("the proxy failed to start") from failure[0]
        try:
            yield self
        finally:
            token = self._token
            scope = self._thread_cancel
            if token is not None and scope is not None:
                with contextlib.suppress(trio.RunFinishedError):
                    token.run_sync_soon(scope.cancel)
            thread.join(timeout)


def _reset(stream: trio.SocketStream) -> None:
    """Close with an RST (SO_LINGER 0), as a dead peer or a pulled cable looks to the other end."""
    sock = stream.socket
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()
