"""An object store that reports each request's latency and failure to a callback (the
node's metrics), around any other store. One call per request."""

from __future__ import annotations

import time
from collections.abc import Callable

from .base import Data, ObjectExists, ObjectNotFound, ObjectStore

# (operation, seconds, failed): create, get, delete, list, check.
Observe = Callable[[str, float, bool], None]

# Answers, not failures: a create that found the key taken, a get of a missing key.
ANSWERS = (ObjectExists, ObjectNotFound)


class InstrumentedObjectStore:
    def __init__(self, store: ObjectStore, observe: Observe) -> None:
        self.store = store
        self.observe = observe

    async def _timed(self, operation: str, call):
        started = time.perf_counter()
        failed = True
        try:
            result = await call
            failed = False
            return result
        except ANSWERS:
            failed = False
            raise
        finally:
            self.observe(operation, time.perf_counter() - started, failed)

    async def create(self, key: str, data: Data) -> None:
        return await self._timed("create", self.store.create(key, data))

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return await self._timed("get", self.store.get(key, start, end))

    async def delete(self, key: str) -> None:
        return await self._timed("delete", self.store.delete(key))

    async def list(self, prefix: str) -> list[str]:
        return await self._timed("list", self.store.list(prefix))

    async def check(self) -> None:
        return await self._timed("check", self.store.check())

    async def aclose(self) -> None:
        await self.store.aclose()

    def __getattr__(self, name: str):
        # Backend extras (delete_many, ...) pass through untimed, except file://'s `compose`
        # (observed as a create), `scan` and `get_view` (each as one get). A backend
        # without one has no such attribute here either, so callers see that it has none.
        extra = getattr(self.store, name)
        if name == "compose":
            async def compose(key: str, parts, **kwargs) -> None:
                return await self._timed("create", extra(key, parts, **kwargs))
            return compose
        if name == "get_view":
            async def get_view(key: str, start: int = 0, end: int | None = None):
                return await self._timed("get", extra(key, start, end))
            return get_view
        if name == "scan":
            async def scan(fn):
                return await self._timed("get", extra(fn))
            return scan
        return extra
