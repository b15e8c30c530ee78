"""The object store interface, its errors and the retry policy shared by the backends."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias, runtime_checkable

Buffer: TypeAlias = bytes | bytearray | memoryview
# What `create` accepts: one buffer, or several written back to back (scatter-gather), so
# callers never have to concatenate a WAL object's batches themselves.
Data: TypeAlias = Buffer | Sequence[Buffer]


# The keys of WAL objects (mink/storage/wal.py): the stores treat them as a produce's
# latency, not background work (file://: synced whole, whatever their size).
WAL_PREFIX = "wal/"


@dataclass(frozen=True, slots=True)
class ObjectRange:
    """Bytes [start, end) of another object: a part of `compose` (file://) copied by the
    store itself, never read into this process."""

    key: str
    start: int
    end: int


class ObjectStoreError(Exception):
    """Base class of every object store error."""


class ObjectExists(ObjectStoreError):
    """`create` refused: an object with this key already exists (create-if-absent)."""


class ObjectNotFound(ObjectStoreError):
    """No object with this key."""


class ObjectStoreUnavailable(ObjectStoreError):
    """Retriable: the store did not answer (endpoint down, throttled, 5xx) and the retries
    are exhausted. The operation may or may not have taken effect."""


class ObjectStoreConfigError(ObjectStoreError):
    """The store is misconfigured (bad URL, missing bucket or folder, bad or missing
    credentials, no permission). The message says what to fix; retrying will not help."""


@runtime_checkable
class ObjectStore(Protocol):
    """A flat namespace of immutable objects. Keys are '/'-separated relative paths."""

    async def create(self, key: str, data: Data) -> None:
        """Store `data` under `key` if no object has that key; else raise ObjectExists."""

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes [start, end) of the object, clipped to its size like a slice (end None: to
        the end); raise ObjectNotFound."""

    async def delete(self, key: str) -> None:
        """Delete the object; deleting a missing object is not an error."""

    async def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        """All keys starting with `prefix` (a plain string prefix), sorted; with
        `start_after`, only the keys after it (S3's StartAfter: the store skips the rest)."""

    async def check(self) -> None:
        """Start-up validation: raise ObjectStoreConfigError saying what to fix."""

    async def aclose(self) -> None:
        """Release connections; the store is unusable afterwards."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential back-off with full jitter: before attempt n+1 sleep
    uniform(0, min(max_delay, base_delay * 2**(n-1))). `attempts` counts the first try."""

    attempts: int = 5
    base_delay: float = 0.1
    max_delay: float = 2.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("RetryPolicy.attempts must be at least 1")
        if self.base_delay < 0 or self.max_delay < 0:
            raise ValueError("RetryPolicy delays must not be negative")

    def delay(self, failed_attempts: int, rng: random.Random | None = None) -> float:
        """Sleep before the next attempt, after `failed_attempts` (>= 1) failures."""
        cap = min(self.max_delay, self.base_delay * (2 ** min(failed_attempts - 1, 62)))
        return (rng or random).uniform(0.0, cap)


def as_buffers(data: Data) -> list[memoryview]:
    """`data` as a list of flat byte memoryviews (no copy)."""
    if isinstance(data, (bytes, bytearray, memoryview)):
        parts: Sequence[Buffer] = (data,)
    elif isinstance(data, (list, tuple)):
        parts = data
    else:
        raise TypeError(f"object data must be bytes-like or a list of them, not {type(data).__name__}")
    out = []
    for part in parts:
        view = memoryview(part)
        if view.ndim != 1 or view.itemsize != 1 or not view.c_contiguous:
            view = view.cast("B") if view.c_contiguous else memoryview(view.tobytes())
        out.append(view)
    return out


def check_range(start: int, end: int | None) -> None:
    if start < 0 or (end is not None and end < 0):
        raise ValueError(f"byte range must not be negative: [{start}, {end})")


def check_key(key: str) -> None:
    """Keys are non-empty relative '/'-separated paths without '.', '..' or empty parts."""
    if not isinstance(key, str) or not key:
        raise ValueError(f"object key must be a non-empty string, not {key!r}")
    if "\0" in key or any(part in ("", ".", "..") for part in key.split("/")):
        raise ValueError(f"invalid object key {key!r}: use a relative path without empty, '.' or '..' parts")
