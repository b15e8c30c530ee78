"""Kafka's windowed Rate (`SampledStat` + `Rate`) and the throttle time of a quota
violation (`QuotaUtils.throttleTime`), with no I/O: times are seconds passed in.

A rate keeps `samples` windows (`quota.window.num`, 11) of `window` seconds
(`quota.window.size.seconds`, 1). A window starts at the first value recorded after the
previous one is complete; windows older than samples x window are reset. The rate is the sum
of the windows over the time since the oldest window started, counted as at least
samples - 1 whole windows, so a new client cannot burst past the quota by dividing by a
short time.
"""

from __future__ import annotations

__all__ = ["Rate", "throttle_time"]


class _Sample:
    __slots__ = ("start", "value")

    def __init__(self, start: float) -> None:
        self.start = start
        self.value = 0.0

    def reset(self, now: float) -> None:
        self.start = now
        self.value = 0.0


class Rate:
    __slots__ = ("samples", "window", "_windows", "_current", "last_recorded")

    def __init__(self, samples: int = 11, window: float = 1.0) -> None:
        self.samples = samples
        self.window = window
        self._windows: list[_Sample] = []
        self._current = 0
        self.last_recorded = 0.0

    def record(self, value: float, now: float) -> None:
        if not self._windows:
            self._windows.append(_Sample(now))
        sample = self._windows[self._current]
        if now - sample.start >= self.window:  # Sample.isComplete
            self._current = (self._current + 1) % self.samples
            if self._current >= len(self._windows):
                sample = _Sample(now)
                self._windows.append(sample)
            else:
                sample = self._windows[self._current]
                sample.reset(now)
        sample.value += value
        self.last_recorded = now

    def _purge(self, now: float) -> None:
        expire = self.samples * self.window
        for sample in self._windows:
            if now - sample.start >= expire:
                sample.reset(now)

    def window_size(self, now: float) -> float:
        """Rate.windowSize: the time the rate is taken over."""
        self._purge(now)
        oldest = min((s.start for s in self._windows), default=now)
        elapsed = now - oldest
        full = int(elapsed // self.window)
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window
        return max(elapsed, 0.001)

    def measure(self, now: float) -> float:
        """Units per second over the windows."""
        size = self.window_size(now)  # purges first
        return sum(s.value for s in self._windows) / size


def throttle_time(rate: Rate, bound: float, now: float) -> float:
    """Seconds to hold a client back so its rate falls to `bound` if it sends nothing more:
    O * W / (W + X) = T gives X = (O - T) / T * W. Zero while the rate is within bound."""
    observed = rate.measure(now)
    if observed <= bound:
        return 0.0
    return (observed - bound) / bound * rate.window_size(now)
