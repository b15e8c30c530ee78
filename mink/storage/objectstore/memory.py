"""memory:// — objects in a dict, for unit tests.

`memory://` gives a private store; `memory://<name>` shares one dict between every store opened
with that name in this process (in-process clusters), for as long as one of them is alive.
"""

from __future__ import annotations

import weakref

import trio

from .base import Data, ObjectExists, ObjectNotFound, ObjectStoreError, as_buffers, check_key, check_range


class _Objects(dict[str, bytes]):
    """A dict that can be weakly referenced (the registry of named stores)."""


_named: weakref.WeakValueDictionary[str, _Objects] = weakref.WeakValueDictionary()


class MemoryObjectStore:
    def __init__(self, name: str | None = None) -> None:
        self.name = name
        if name is None:
            self._objects = _Objects()
        else:
            objects = _named.get(name)
            if objects is None:
                objects = _named[name] = _Objects()
            self._objects = objects
        self._closed = False

    def __repr__(self) -> str:
        return f"MemoryObjectStore({self.name!r}, {len(self._objects)} objects)"

    async def __aenter__(self) -> MemoryObjectStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _check_open(self) -> None:
        if self._closed:
            raise ObjectStoreError("the object store is closed")

    # Each operation is a checkpoint, like a real store, and atomic (no await after the check).

    async def create(self, key: str, data: Data) -> None:
        check_key(key)
        blob = b"".join(as_buffers(data))  # a copy: the caller may reuse its buffers
        await trio.lowlevel.checkpoint()
        self._check_open()
        if key in self._objects:
            raise ObjectExists(key)
        self._objects[key] = blob

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        check_key(key)
        check_range(start, end)
        await trio.lowlevel.checkpoint()
        self._check_open()
        try:
            blob = self._objects[key]
        except KeyError:
            raise ObjectNotFound(key) from None
        if start == 0 and end is None:
            return blob
        return blob[start:end]

    async def delete(self, key: str) -> None:
        check_key(key)
        await trio.lowlevel.checkpoint()
        self._check_open()
        self._objects.pop(key, None)

    async def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        await trio.lowlevel.checkpoint()
        self._check_open()
        return sorted(k for k in self._objects if k.startswith(prefix)
                      and (start_after is None or k > start_after))

    async def check(self) -> None:
        await trio.lowlevel.checkpoint()
        self._check_open()

    async def aclose(self) -> None:
        self._closed = True
