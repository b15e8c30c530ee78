"""PostgreSQL connections run by trio itself: the metadata store's pool.

psycopg's async connection does every wait through `AsyncConnection.wait`, which hands the
socket to asyncio; under trio_asyncio that is a crossing into the asyncio loop and a reader,
a future and a timer per wait, 0.3 ms of node CPU for a bare `SELECT 1` and 0.7 ms for a
CommitWal. `TrioConnection` overrides that one method to wait on trio's own I/O (psycopg's
generators say which readiness they need; nothing else in a statement's path touches
asyncio), about a quarter of it. Connecting still goes through asyncio (psycopg resolves
host names there): it is rare, and it needs the store's trio_asyncio loop.

`ConnectionPool` is the little of psycopg_pool the store used: at most `max_size`
connections, a wait for one bounded by `timeout`, idle ones reused newest first and closed
after `max_idle` or `max_lifetime`, any connection returned broken or not idle closed. A
statement whose caller is cancelled (a deadline) is cancelled in the server too, as psycopg
does, and waited for up to CANCEL_TIMEOUT; its outcome is the caller's to judge.
"""

from __future__ import annotations

import logging
import select
from collections.abc import Awaitable, Callable

import psycopg
import trio
from psycopg import pq
from psycopg.waiting import Ready, Wait

logger = logging.getLogger(__name__)

_WAIT_R, _WAIT_W, _WAIT_RW = Wait.R, Wait.W, Wait.RW
_READY_R, _READY_W = Ready.R, Ready.W
_IDLE = pq.TransactionStatus.IDLE
_ACTIVE = pq.TransactionStatus.ACTIVE


class PoolTimeout(Exception):
    """No connection within the pool's timeout (every one busy, or PostgreSQL unreachable)."""


class PoolClosed(Exception):
    """The pool was closed."""


async def _ready(state, fileno: int) -> int:
    """Wait on trio for what one step of psycopg's generators asks; the readiness to send."""
    if state == _WAIT_R:
        await trio.lowlevel.wait_readable(fileno)
        return _READY_R
    if state == _WAIT_W:
        await trio.lowlevel.wait_writable(fileno)
        return _READY_W
    if state == _WAIT_RW:
        return await _readable_or_writable(fileno)
    raise psycopg.InternalError(f"bad poll status: {state}")


async def _drive(gen, fileno: int):
    """Run one of psycopg's generators to its end, waiting on trio for what it asks."""
    try:
        state = next(gen)
        while True:
            state = gen.send(await _ready(state, fileno))
    except StopIteration as ex:
        return ex.value
    except OSError as ex:
        raise psycopg.OperationalError("connection socket closed") from ex


async def _readable_or_writable(fileno: int) -> int:
    """Only while a large statement is sent: the server may be waiting for us to read."""
    ready = _poll_now(fileno)
    if ready:
        return ready
    result: list[int] = []
    async with trio.open_nursery() as nursery:
        async def wait(fn, flag: int) -> None:
            await fn(fileno)
            result.append(flag)
            nursery.cancel_scope.cancel()
        nursery.start_soon(wait, trio.lowlevel.wait_readable, _READY_R)
        nursery.start_soon(wait, trio.lowlevel.wait_writable, _READY_W)
    return _poll_now(fileno) or result[0]


def _poll_now(fileno: int) -> int:
    poller = select.poll()
    poller.register(fileno, select.POLLIN | select.POLLOUT)
    ready = 0
    for _, events in poller.poll(0):
        if events & (select.POLLIN | select.POLLERR | select.POLLHUP):
            ready |= _READY_R
        if events & select.POLLOUT:
            ready |= _READY_W
    return ready


async def _drive_conn(gen):
    """As `_drive`, for the generators that say their descriptor at each step (cancel)."""
    try:
        fileno, state = next(gen)
        while True:
            fileno, state = gen.send(await _ready(state, fileno))
    except StopIteration as ex:
        return ex.value
    except OSError as ex:
        raise psycopg.OperationalError("connection socket closed") from ex


# How long a statement whose caller was cancelled may take to end once the server was asked
# to cancel it, before its connection is closed instead. A server that answers at all ends
# a cancelled statement in milliseconds; a paused one never does, and the caller (a lease
# renewal cut at its deadline, a commit in doubt) waits this long before it can try again.
# psycopg's own figure, 5 s (twice: the cancel, then the statement), held a node's
# re-registration up by as much in the fault campaign's PostgreSQL pauses.
CANCEL_TIMEOUT = 1.0


class TrioConnection(psycopg.AsyncConnection):
    """An async psycopg connection whose statements wait on trio's I/O, not asyncio's.

    Used by one task at a time (the pool sees to it): its asyncio lock is then never
    contended and never needs a loop."""

    opened_at = 0.0  # trio time, set by the pool: connections are replaced after max_lifetime

    async def wait(self, gen, interval: float | None = None, timeout: float | None = None):
        fileno = self.pgconn.socket
        try:
            if timeout is None:
                return await _drive(gen, fileno)
            with trio.move_on_after(timeout):
                return await _drive(gen, fileno)
            raise psycopg.OperationalError(f"no answer within {timeout} s")
        except trio.Cancelled:
            if self.pgconn.transaction_status == _ACTIVE:
                with trio.CancelScope(shield=True):
                    await self._end_abandoned_statement(gen, fileno)
            raise

    async def _end_abandoned_statement(self, gen, fileno: int) -> None:
        """What psycopg does when a statement is interrupted: the server is asked to cancel
        it and the statement is waited for, so that nothing goes on running (holding locks,
        perhaps committing) after its caller gave up; if that takes over CANCEL_TIMEOUT
        seconds or fails, the connection is closed."""
        with trio.move_on_after(CANCEL_TIMEOUT) as waited:
            try:
                if psycopg.capabilities.has_cancel_safe():
                    await _drive_conn(self._cancel_gen())
                else:  # libpq before 17: its blocking cancel, in a worker thread
                    await trio.to_thread.run_sync(self.cancel, abandon_on_cancel=True)
                await _drive(gen, fileno)
                return  # it ended before the cancel reached it: the caller's outcome is unknown
            except psycopg.errors.QueryCanceled:
                return
            except psycopg.Error as exc:
                logger.warning("cancelling an abandoned statement failed (%s): closing its "
                               "connection", exc)
        if waited.cancelled_caught:
            logger.warning("an abandoned statement did not end within %.1f s of its "
                           "cancellation: closing its connection", CANCEL_TIMEOUT)
        self.pgconn.finish()


def looks_dead(conn: psycopg.AsyncConnection) -> bool:
    """True if an idle pooled connection was closed by the server (restart, shutdown).

    An idle connection has nothing to read; if its socket is readable, let libpq read: EOF or a
    FATAL message marks it BAD. Costs one poll() syscall in the common case."""
    pgconn = conn.pgconn
    if pgconn.status != pq.ConnStatus.OK:
        return True
    try:
        fd = pgconn.socket
    except psycopg.Error:
        return True
    poller = select.poll()  # not select(): descriptors above 1024 are common in a broker
    poller.register(fd, select.POLLIN)
    for _ in range(3):
        try:
            readable = poller.poll(0)
        except OSError:
            return False  # cannot tell: let the statement find out
        if not readable:
            return False
        try:
            pgconn.consume_input()
        except psycopg.Error:
            return True
        if pgconn.status != pq.ConnStatus.OK:
            return True
    return False


# A failed connection attempt is repeated within the wait's timeout, 50 ms later, then half
# as long again each time: a PostgreSQL restart of a fraction of a second costs no request
# more than that.
_FIRST_RETRY = 0.05
_RETRY_GROWTH = 1.5
_LONGEST_RETRY = 1.0


class ConnectionPool:
    def __init__(self, connect: Callable[[], Awaitable[TrioConnection]], *, max_size: int,
                 timeout: float, min_size: int = 1, max_idle: float = 600.0,
                 max_lifetime: float = 3600.0) -> None:
        self._connect = connect
        self.max_size = max_size
        self.min_size = min_size
        self.timeout = timeout
        self.max_idle = max_idle
        self.max_lifetime = max_lifetime
        self._slots = trio.Semaphore(max_size)
        self._idle: list[tuple[TrioConnection, float]] = []  # (connection, returned at)
        self.closed = False

    def _worn_out(self, conn: TrioConnection, now: float) -> bool:
        return now - conn.opened_at >= self.max_lifetime

    async def getconn(self) -> TrioConnection:
        """A connection of this task's own until `putconn`; PoolTimeout after `timeout` s."""
        if self.closed:
            raise PoolClosed("the pool is closed")
        deadline = trio.current_time() + self.timeout
        with trio.move_on_at(deadline) as waited:
            await self._slots.acquire()
        if waited.cancelled_caught:
            raise PoolTimeout(f"no connection free within {self.timeout} s "
                              f"({self.max_size} in use)")
        try:
            now = trio.current_time()
            while self._idle:
                conn, _ = self._idle.pop()
                if not self._worn_out(conn, now):
                    return conn
                self._close(conn)
            return await self._open(deadline)
        except BaseException:
            self._slots.release()
            raise

    async def _open(self, deadline: float) -> TrioConnection:
        delay = _FIRST_RETRY
        while True:
            try:
                with trio.move_on_at(deadline):
                    conn = await self._connect()
                    conn.opened_at = trio.current_time()
                    return conn
                error: Exception | str = "connecting took too long"
            except psycopg.OperationalError as exc:
                error = exc
            if trio.current_time() + delay >= deadline:
                raise PoolTimeout(f"no connection within {self.timeout} s: {error}")
            logger.debug("connection attempt failed, again in %.2f s: %s", delay, error)
            await trio.sleep(delay)
            delay = min(delay * _RETRY_GROWTH, _LONGEST_RETRY)

    def putconn(self, conn: TrioConnection) -> None:
        """Give a connection back: kept if it is healthy and idle, otherwise closed."""
        try:
            now = trio.current_time()
            if (self.closed or conn.closed or conn.broken
                    or conn.pgconn.transaction_status != _IDLE
                    or self._worn_out(conn, now)):
                self._close(conn)
                return
            self._idle.append((conn, now))
            # the longest idle beyond min_size go: the pool shrinks back after a burst
            while (len(self._idle) > self.min_size
                   and now - self._idle[0][1] >= self.max_idle):
                self._close(self._idle.pop(0)[0])
        finally:
            self._slots.release()

    def check(self) -> None:
        """After a connection loss: close every idle connection the server closed."""
        alive = []
        for conn, returned_at in self._idle:
            if looks_dead(conn):
                self._close(conn)
            else:
                alive.append((conn, returned_at))
        self._idle = alive

    def close(self) -> None:
        """Close the idle connections; those in use are closed when they come back."""
        self.closed = True
        idle, self._idle = self._idle, []
        for conn, _ in idle:
            self._close(conn)

    def _close(self, conn: TrioConnection) -> None:
        try:
            conn.pgconn.finish()  # what AsyncConnection.close does, without its await
        except Exception as exc:  # pragma: no cover - closing is best effort
            logger.debug("closing a connection failed: %s", exc)
