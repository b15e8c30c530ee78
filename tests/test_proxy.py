"""The fault-injection TCP proxy (mink.testing.proxy) against a trivial echo server."""

from __future__ import annotations

import contextlib
import socket
import threading
import time

import pytest
import trio

from mink.testing.proxy import TcpProxy


async def _echo(stream: trio.SocketStream) -> None:
    try:
        async for data in stream:
            await stream.send_all(data)
    except trio.BrokenResourceError:
        pass


async def _start_echo(nursery) -> int:
    listeners = await nursery.start(trio.serve_tcp, _echo, 0)
    return listeners[0].socket.getsockname()[1]


async def _receive_exactly(stream: trio.SocketStream, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = await stream.receive_some(size - len(data))
        if not chunk:
            raise EOFError(f"closed after {len(data)} of {size} bytes")
        data += chunk
    return data


@pytest.fixture
async def proxy(nursery) -> TcpProxy:
    echo_port = await _start_echo(nursery)
    proxy = TcpProxy("127.0.0.1", echo_port)
    address = await nursery.start(proxy.run)
    assert address == proxy.address
    return proxy


async def _connect(proxy: TcpProxy) -> trio.SocketStream:
    return await trio.open_tcp_stream(*proxy.address)


async def test_forwards_both_ways(proxy: TcpProxy) -> None:
    stream = await _connect(proxy)
    payload = bytes(range(256)) * 1000
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stream.send_all, payload)
        with trio.fail_after(5):
            assert await _receive_exactly(stream, len(payload)) == payload
    assert proxy.bytes_to_upstream == len(payload)
    await stream.aclose()


async def test_stall_holds_bytes_until_resume(proxy: TcpProxy) -> None:
    stream = await _connect(proxy)
    await stream.send_all(b"before")
    with trio.fail_after(5):
        assert await _receive_exactly(stream, 6) == b"before"
    proxy.stall()
    await stream.send_all(b"held")
    # Nothing may come back while stalled: a bounded wait that must time out.
    with trio.move_on_after(0.5) as waited:
        await stream.receive_some(100)
    assert waited.cancelled_caught, "bytes were forwarded while stalled"
    assert proxy.connection_count == 1  # the connection stays open
    proxy.resume()
    with trio.fail_after(5):
        assert await _receive_exactly(stream, 4) == b"held"
    await stream.aclose()


async def test_cut_closes_connections_and_refuses_new_ones(proxy: TcpProxy) -> None:
    stream = await _connect(proxy)
    await stream.send_all(b"x")
    with trio.fail_after(5):
        await _receive_exactly(stream, 1)
    proxy.cut()
    with trio.fail_after(5):
        with pytest.raises((trio.BrokenResourceError, EOFError)):
            await _receive_exactly(stream, 1)
    with trio.fail_after(5):
        # Refused: reset at connect, at send or at the first read, depending on timing.
        with pytest.raises((OSError, trio.BrokenResourceError, EOFError)):
            fresh = await _connect(proxy)
            await fresh.send_all(b"y")
            await _receive_exactly(fresh, 1)
    proxy.restore()
    again = await _connect(proxy)
    await again.send_all(b"z")
    with trio.fail_after(5):
        assert await _receive_exactly(again, 1) == b"z"
    await again.aclose()


async def test_delay_adds_latency_per_chunk(proxy: TcpProxy) -> None:
    stream = await _connect(proxy)
    proxy.set_delay(0.3)
    started = trio.current_time()
    await stream.send_all(b"ping")
    with trio.fail_after(5):
        assert await _receive_exactly(stream, 4) == b"ping"
    elapsed = trio.current_time() - started
    assert elapsed >= 0.6  # 0.3 s each way
    proxy.set_delay(0)
    started = trio.current_time()
    await stream.send_all(b"pong")
    with trio.fail_after(5):
        await _receive_exactly(stream, 4)
    assert trio.current_time() - started < 0.3
    await stream.aclose()


async def test_drop_replies_discards_upstream_bytes_only(proxy: TcpProxy) -> None:
    stream = await _connect(proxy)
    proxy.drop_replies(True)
    await stream.send_all(b"lost")
    with trio.fail_after(5):
        while proxy.bytes_dropped < 4:  # the request reached the echo server; its reply was dropped
            await trio.sleep(0.01)
    assert proxy.bytes_to_upstream == 4
    proxy.drop_replies(False)
    await stream.send_all(b"kept")
    with trio.fail_after(5):
        assert await _receive_exactly(stream, 4) == b"kept"
    await stream.aclose()


def test_in_thread_from_sync_code() -> None:
    """Sync tests run the proxy in its own thread; controls take effect before they return."""
    echo = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def echo_one(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            while data := conn.recv(65536):
                conn.sendall(data)

    def serve_echo() -> None:
        echo.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = echo.accept()
            except TimeoutError:
                continue
            conn.settimeout(None)
            threading.Thread(target=echo_one, args=(conn,), daemon=True).start()

    server = threading.Thread(target=serve_echo, daemon=True)
    server.start()
    try:
        with TcpProxy("127.0.0.1", echo.getsockname()[1]).in_thread() as proxy:
            with socket.create_connection(proxy.address, timeout=5) as conn:
                conn.sendall(b"hello")
                assert conn.recv(5) == b"hello"
                proxy.stall()
                conn.sendall(b"later")
                conn.settimeout(0.5)
                with pytest.raises(TimeoutError):
                    conn.recv(5)
                proxy.resume()
                conn.settimeout(5)
                assert conn.recv(5) == b"later"
                proxy.cut()
                try:
                    closed = conn.recv(5) == b""
                except ConnectionResetError:
                    closed = True
                assert closed, "the connection survived cut()"
            deadline = time.monotonic() + 5
            while proxy.connection_count and time.monotonic() < deadline:
                time.sleep(0.01)
            assert proxy.connection_count == 0
            proxy.restore()
            with socket.create_connection(proxy.address, timeout=5) as conn:
                conn.sendall(b"again")
                assert conn.recv(5) == b"again"
            thread_names = {t.name for t in threading.enumerate()}
            assert "mink-tcp-proxy" in thread_names
        assert "mink-tcp-proxy" not in {t.name for t in threading.enumerate()}
    finally:
        stop.set()
        server.join(5)
        echo.close()
