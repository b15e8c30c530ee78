"""Wrappers for tests and benchmarks: added latency, injected failures."""

from __future__ import annotations

import collections
import random
from collections.abc import Callable
from dataclasses import dataclass

import trio

from .base import Data, ObjectStore, ObjectStoreUnavailable, as_buffers

OPS = ("create", "get", "delete", "list", "check")

ExcSpec = type[BaseException] | BaseException | Callable[[str, str], BaseException]


class LatencyObjectStore:
    """Sleeps uniform(mean - jitter, mean + jitter) per request, plus size / bytes_per_s if
    given, like a remote store. Concurrent requests overlap. `counts` counts requests per op."""

    def __init__(
        self,
        inner: ObjectStore,
        mean_s: float = 0.020,
        jitter_s: float = 0.010,
        *,
        bytes_per_s: float | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.inner = inner
        self.mean_s = mean_s
        self.jitter_s = jitter_s
        self.bytes_per_s = bytes_per_s
        self.counts: collections.Counter[str] = collections.Counter()
        self._rng = rng or random.Random()

    def __repr__(self) -> str:
        return f"LatencyObjectStore({self.inner!r}, mean_s={self.mean_s}, jitter_s={self.jitter_s})"

    async def __aenter__(self) -> LatencyObjectStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _sleep(self, op: str, nbytes: int = 0) -> None:
        self.counts[op] += 1
        delay = max(0.0, self._rng.uniform(self.mean_s - self.jitter_s, self.mean_s + self.jitter_s))
        if self.bytes_per_s:
            delay += nbytes / self.bytes_per_s
        await trio.sleep(delay)

    async def create(self, key: str, data: Data) -> None:
        size = sum(b.nbytes for b in as_buffers(data)) if self.bytes_per_s else 0
        await self._sleep("create", size)
        await self.inner.create(key, data)

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        await self._sleep("get")  # a miss costs a round trip too
        data = await self.inner.get(key, start, end)
        if self.bytes_per_s:
            await trio.sleep(len(data) / self.bytes_per_s)
        return data

    async def delete(self, key: str) -> None:
        await self._sleep("delete")
        await self.inner.delete(key)

    async def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        await self._sleep("list")
        return await self.inner.list(prefix, start_after)

    async def check(self) -> None:
        await self.inner.check()

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class _Rule:
    op: str  # an op name or "*"
    predicate: Callable[[str, str], bool] | None
    remaining: int | None  # None: every matching call
    exc: ExcSpec | None  # None: no failure (a stall only)
    after: bool  # run the operation first, then fail: it took effect but the caller sees an error
    until: trio.Event | None  # stall matching calls until this event is set

    def matches(self, op: str, key: str) -> bool:
        return (self.op == "*" or self.op == op) and (self.predicate is None or self.predicate(op, key))


class FaultyObjectStore:
    """Passes calls to `inner` unless a rule says to fail or stall them.

    fail_next("create", 2)                       the next two creates raise ObjectStoreUnavailable
    fail_next("create", exc=ObjectStoreError("x"), after=True)
                                                 the next create stores the object, then raises
    fail_when(lambda op, key: key.startswith("wal/"))   every matching call fails until removed
    stall("create", event)                       matching calls wait until `event` is set

    Rules are checked in the order they were added; the first match applies. `calls` records
    (op, key) for every call (the prefix for list, "" for check).
    """

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.calls: list[tuple[str, str]] = []
        self._rules: list[_Rule] = []

    def __repr__(self) -> str:
        return f"FaultyObjectStore({self.inner!r}, {len(self._rules)} rules)"

    async def __aenter__(self) -> FaultyObjectStore:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def _add(self, rule: _Rule) -> Callable[[], None]:
        if rule.op != "*" and rule.op not in OPS:
            raise ValueError(f"unknown object store operation {rule.op!r}; one of {OPS} or '*'")
        self._rules.append(rule)

        def remove() -> None:
            if rule in self._rules:
                self._rules.remove(rule)

        return remove

    def fail_next(
        self,
        op: str = "*",
        n: int = 1,
        exc: ExcSpec = ObjectStoreUnavailable,
        *,
        after: bool = False,
        key: str | None = None,
    ) -> Callable[[], None]:
        """The next `n` calls of `op` (on `key`, if given) fail with `exc` (an exception class,
        instance, or a function (op, key) -> exception). Returns a function removing the rule."""
        predicate = None if key is None else (lambda _op, k: k == key)
        return self._add(_Rule(op, predicate, n, exc, after, None))

    def fail_when(
        self,
        predicate: Callable[[str, str], bool],
        exc: ExcSpec = ObjectStoreUnavailable,
        *,
        op: str = "*",
        after: bool = False,
        n: int | None = None,
    ) -> Callable[[], None]:
        """Calls for which predicate(op, key) is true fail (the first `n`, or all until removed)."""
        return self._add(_Rule(op, predicate, n, exc, after, None))

    def stall(
        self,
        op: str,
        until: trio.Event,
        *,
        n: int | None = None,
        predicate: Callable[[str, str], bool] | None = None,
    ) -> Callable[[], None]:
        """Matching calls wait until `until` is set, then proceed (cancellable)."""
        return self._add(_Rule(op, predicate, n, None, False, until))

    def clear(self) -> None:
        self._rules.clear()

    def _rule_for(self, op: str, key: str) -> _Rule | None:
        self.calls.append((op, key))
        for rule in self._rules:
            if rule.matches(op, key):
                if rule.remaining is not None:
                    rule.remaining -= 1
                    if rule.remaining <= 0:
                        self._rules.remove(rule)
                return rule
        return None

    async def _apply(self, op: str, key: str, call: Callable[[], object]) -> object:
        rule = self._rule_for(op, key)
        if rule is None:
            return await call()  # type: ignore[misc]
        if rule.until is not None:
            await rule.until.wait()
        if rule.exc is None:
            return await call()  # type: ignore[misc]
        if rule.after:
            await call()  # type: ignore[misc]
        else:
            await trio.lowlevel.checkpoint()
        raise _make_exc(rule.exc, op, key)

    async def create(self, key: str, data: Data) -> None:
        await self._apply("create", key, lambda: self.inner.create(key, data))

    async def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        return await self._apply("get", key, lambda: self.inner.get(key, start, end))  # type: ignore[return-value]

    async def delete(self, key: str) -> None:
        await self._apply("delete", key, lambda: self.inner.delete(key))

    async def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        return await self._apply("list", prefix, lambda: self.inner.list(prefix, start_after))  # type: ignore[return-value]

    async def check(self) -> None:
        await self._apply("check", "", lambda: self.inner.check())

    async def aclose(self) -> None:
        await self.inner.aclose()


def _make_exc(spec: ExcSpec, op: str, key: str) -> BaseException:
    if isinstance(spec, BaseException):
        return spec
    if isinstance(spec, type) and issubclass(spec, BaseException):
        return spec(f"injected failure: {op} {key!r}")
    return spec(op, key)
