"""Mink nodes for code that is not on trio: plain (sync) tests and asyncio tests.

One background thread per process runs one `trio.run` (the `HarnessThread`); nodes and
clusters opened for blocking callers are tasks in it, the same `open_node`/`open_cluster` a trio
caller uses. `BlockingNode` and `BlockingCluster` wrap their handles: every method blocks until
done in the harness thread (so it is safe to call from any thread, and from an asyncio test
too: it holds that test's event loop for as long as the call lasts, as any blocking call does).

Why a thread rather than a subprocess: a node in a thread starts in a fraction of the time of a
fresh interpreter importing Mink (about a second), shares the session's warm imports, and its
"kill" (connections dropped, membership and leases left to expire) is what a client and the
other nodes observe of a SIGKILL. A test of what the OS does to a killed process (file handles,
half-written files) needs `mink serve` in a subprocess instead.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import Any

import trio

from mink.testing.cluster import MinkCluster, MinkNode, open_cluster, open_node
from mink.testing.postgres import TestPostgres


class HarnessThread:
    """A daemon thread running one trio.run, hosting nodes for blocking callers."""

    def __init__(self, name: str = "mink-testing") -> None:
        self._ready = threading.Event()
        self._token: trio.lowlevel.TrioToken | None = None
        self._nursery: trio.Nursery | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def _main(self) -> None:
        async def main() -> None:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                self._token = trio.lowlevel.current_trio_token()
                self._ready.set()
                await trio.sleep_forever()

        try:
            trio.run(main)
        except BaseException as exc:  # reported to whoever waits for it
            self._error = exc
        finally:
            self._ready.set()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def run(self, async_fn: Callable[..., Any], *args: Any) -> Any:
        _not_on_trio()
        return trio.from_thread.run(async_fn, *args, trio_token=self._token)

    def run_sync(self, fn: Callable[..., Any], *args: Any) -> Any:
        _not_on_trio()
        return trio.from_thread.run_sync(fn, *args, trio_token=self._token)

    @contextmanager
    def enter(self, manager: AbstractAsyncContextManager) -> Iterator[Any]:
        """`async with manager as value` in the harness thread, for the `with` block's time."""
        leave = trio.Event()
        done = trio.Event()
        failure: list[BaseException] = []

        async def host(task_status=trio.TASK_STATUS_IGNORED) -> None:
            started = False
            try:
                async with manager as value:
                    task_status.started(value)
                    started = True
                    await leave.wait()
            except BaseException as exc:  # noqa: BLE001 - handed to the blocking caller
                if not started:
                    raise
                failure.append(exc)
            finally:
                done.set()

        value = self.run(self._nursery.start, host)
        try:
            yield value
        finally:
            self.run_sync(leave.set)
            self.run(done.wait)
            if failure:
                raise failure[0]

    def close(self) -> None:
        if self._thread.is_alive() and self._nursery is not None:
            self.run_sync(self._nursery.cancel_scope.cancel)
        self._thread.join(30)


def _not_on_trio() -> None:
    if trio.lowlevel.in_trio_run():
        raise RuntimeError(
            "the blocking mink fixtures (mink_broker, mink_cluster) would block this trio "
            "run: in a trio test use mink_trio_broker / mink_trio_cluster, or call them "
            "through trio.to_thread.run_sync")


class _Blocking:
    """Forwards to a trio-side handle; async methods and trio-touching methods block until
    done in the harness thread."""

    def __init__(self, target: Any, harness: HarnessThread) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_harness", harness)

    def __repr__(self) -> str:
        return f"<blocking {self._target!r}>"

    def __dir__(self) -> list[str]:
        return [n for n in dir(self._target) if not n.startswith("_")]

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._target, name)
        harness = self._harness
        if inspect.iscoroutinefunction(value):
            @functools.wraps(value)
            def blocking(*args: Any, **kwargs: Any) -> Any:
                return _wrap(harness.run(functools.partial(value, *args, **kwargs)), harness)
            return blocking
        if inspect.ismethod(value):
            @functools.wraps(value)
            def in_harness(*args: Any, **kwargs: Any) -> Any:
                return _wrap(harness.run_sync(functools.partial(value, *args, **kwargs)),
                             harness)
            return in_harness
        return _wrap(value, harness)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only; use its methods")


class BlockingNode(_Blocking):
    """A MinkNode for blocking code: same attributes and methods, every call blocking."""


class BlockingCluster(_Blocking):
    """A MinkCluster for blocking code: same attributes and methods, every call blocking."""


def _wrap(value: Any, harness: HarnessThread) -> Any:
    if isinstance(value, MinkNode):
        return BlockingNode(value, harness)
    if isinstance(value, MinkCluster):
        return BlockingCluster(value, harness)
    if isinstance(value, list) and value and isinstance(value[0], MinkNode):
        return [BlockingNode(v, harness) for v in value]
    return value


@contextmanager
def blocking_node(harness: HarnessThread, postgres: TestPostgres | None = None,
                  **config: Any) -> Iterator[BlockingNode]:
    with harness.enter(open_node(postgres, **config)) as node:
        yield BlockingNode(node, harness)


@contextmanager
def blocking_cluster(harness: HarnessThread, nodes: int = 3,
                     postgres: TestPostgres | None = None,
                     **config: Any) -> Iterator[BlockingCluster]:
    with harness.enter(open_cluster(nodes, postgres, **config)) as cluster:
        yield BlockingCluster(cluster, harness)
