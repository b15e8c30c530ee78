"""The soak benchmark's verdict (benchmarks/soak.py): a series that swings around a level
passes, one that grows passes only while its growth over the second half stays within 10%."""

import math
import random

from benchmarks.soak import verdict

SAMPLE_S = 10.0
SAMPLES = 120  # 20 minutes at one sample every 10 s, as the soak runs


def judged(values: list[float]) -> dict:
    samples = [{"t_s": (i + 1) * SAMPLE_S, "wal_objects": v} for i, v in enumerate(values)]
    return verdict(samples)["wal_objects"]


def test_flat_series_passes():
    result = judged([5000.0] * SAMPLES)
    assert result["ok"] and result["growth"] == 0


def test_series_swinging_around_a_level_passes_whatever_the_phase():
    # retention drops a minute of rows at once: a sawtooth of +-25% with a 60 or 70 s period;
    # and a +-20% swing with a 90 s or a 2-minute period. Every phase: the half-way sample on
    # a trough and the last one on a peak too (the old last-against-half criterion judged
    # exactly that, and failed these by up to +66%).
    for period in (6, 7):
        for phase in range(period):
            sawtooth = [1000 * (0.75 + 0.5 * (((i + phase) % period) / (period - 1)))
                        for i in range(SAMPLES)]
            assert judged(sawtooth)["ok"], (period, phase, judged(sawtooth))
    for period in (9, 12):
        for phase in range(period):
            swing = [1000 * (1 + 0.2 * math.sin(2 * math.pi * (i + phase) / period))
                     for i in range(SAMPLES)]
            assert judged(swing)["ok"], (period, phase, judged(swing))
    noise = random.Random(16)
    noisy = [1000 * (1 + noise.uniform(-0.25, 0.25)) for _ in range(SAMPLES)]
    assert judged(noisy)["ok"], judged(noisy)


def test_a_spike_near_the_end_is_not_growth():
    # objects_to_delete: empty but while a collection batch is in flight
    spiky = [0.0] * SAMPLES
    spiky[-10], spiky[-30] = 111.0, 47.0
    assert judged(spiky)["ok"], judged(spiky)


def test_steady_growth_of_20_percent_over_the_second_half_fails():
    # a leak: +20% across the second half (and as fast before it), with a swing on top
    half = SAMPLES // 2
    growing = [1000 * (1 + 0.2 * (i - half) / (SAMPLES - 1 - half))
               * (1 + 0.1 * math.sin(2 * math.pi * i / 6)) for i in range(SAMPLES)]
    result = judged(growing)
    assert not result["ok"]
    assert 0.15 < result["growth"] < 0.25, result


def test_growth_that_starts_late_fails():
    # flat for three quarters, then +30% over the last quarter
    quarter = SAMPLES // 4
    late = [1000.0] * (SAMPLES - quarter) + [1000 * (1 + 0.3 * (i + 1) / quarter)
                                            for i in range(quarter)]
    assert not judged(late)["ok"], judged(late)


def test_growth_of_11_percent_fails_and_9_percent_passes():
    half = SAMPLES // 2

    def ramp(total: float) -> list[float]:
        return [1000 * (1 + total * max(0, i - half) / (SAMPLES - 1 - half))
                for i in range(SAMPLES)]

    assert not judged(ramp(0.11))["ok"]
    assert judged(ramp(0.09))["ok"]


def test_a_handful_of_rows_is_not_growth():
    # 3 rows becoming 6 is +100% of almost nothing: growth is relative to at least 50 rows
    result = judged([3.0] * (SAMPLES - 10) + [6.0] * 10)
    assert result["ok"], result


def test_too_few_samples_give_no_verdict_rather_than_a_pass():
    result = verdict([{"t_s": 10.0 * (i + 1), "wal_objects": 1} for i in range(4)])
    assert "ok" not in result["wal_objects"]


def counted(values: list[float], rates: list[float], series: str = "wal_objects",
            inserted: str = "wal_objects_inserted") -> dict:
    """Samples of a counted series with the rate its rows come at (by default the node's
    object rate) given per interval."""
    samples, committed = [], 0.0
    for i, (value, rate) in enumerate(zip(values, rates)):
        committed += rate * SAMPLE_S
        samples.append({"t_s": (i + 1) * SAMPLE_S, series: value, inserted: round(committed)})
    return verdict(samples)[series]


def test_a_count_that_follows_a_rising_object_rate_passes_by_its_window():
    # the node writes 40% more objects a second in the second half (a busier or an idler
    # machine), each staying 380 s: the count rises with the rate, its window does not
    half = SAMPLES // 2
    rates = [10.0 if i < half else 10.0 * (1 + 0.4 * (i - half) / (SAMPLES - half))
             for i in range(SAMPLES)]
    window_s = 380
    values = []
    for i in range(SAMPLES):
        kept = rates[max(0, i - window_s // 10):i + 1]
        values.append(sum(kept) * SAMPLE_S)
    result = counted(values, rates)
    assert result["growth"] > 0.10, result  # the raw trend alone would fail it
    assert result["ok"] and abs(result["window_growth"]) <= 0.10, result


def test_a_leak_fails_by_its_count_and_its_window():
    # a constant object rate, and rows that stay: the count and the window grow by 20%
    rates = [10.0] * SAMPLES
    half = SAMPLES // 2
    values = [3800 * (1 + 0.2 * (i - half) / (SAMPLES - 1 - half)) for i in range(SAMPLES)]
    result = counted(values, rates)
    assert not result["ok"], result
    assert result["window_growth"] > 0.10, result


def change_log(values: list[float], rates: list[float]) -> dict:
    """Samples of change_log with the rate versions are written given per interval."""
    return counted(values, rates, "change_log", "change_log_inserted")


def test_change_log_that_follows_more_versions_a_second_passes_by_its_window():
    # self-fencings under load write more versions in the second half; each row stays its
    # 330 s: the count rises with the version rate, its window does not
    half = SAMPLES // 2
    rates = [1.0 if i < half else 1.0 + 0.5 * (i - half) / (SAMPLES - half)
             for i in range(SAMPLES)]
    values = [sum(rates[max(0, i - 33):i + 1]) * SAMPLE_S for i in range(SAMPLES)]
    result = change_log(values, rates)
    assert result["growth"] > 0.10, result
    assert result["ok"] and abs(result["window_growth"]) <= 0.10, result


def test_change_log_rows_that_are_never_pruned_fail():
    # a constant version rate and no pruning: the count and its window grow without bound
    rates = [1.0] * SAMPLES
    values = [10.0 * (i + 1) for i in range(SAMPLES)]
    result = change_log(values, rates)
    assert not result["ok"], result
    assert result["window_growth"] > 0.10, result
