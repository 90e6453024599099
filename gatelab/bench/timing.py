"""Timing steps side by side: interleaved rounds, and how far a ratio of two medians would move in a rerun."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

from gatelab.bench.machine import synchronize


def time_interleaved(steps: dict[str, Callable[[], None]], warmup: int, measured: int) -> dict[str, list[float]]:
    """Seconds of each step, taking one step of each in turn, `warmup` rounds untimed then `measured` timed."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    for round_index in range(warmup + measured):
        for name, step in steps.items():
            synchronize()
            started = time.perf_counter()
            step()
            synchronize()
            if round_index >= warmup:
                times[name].append(time.perf_counter() - started)
    return times


def ratio_interval(times: list[float], reference: list[float], paired: bool,
                   confidence: float = 0.95) -> tuple[float, float] | None:
    """A bootstrap interval of median(times) / median(reference): the range a rerun of the same measurement would
    likely give, which a single ratio hides. On a shared 2-core machine one step's time spreads by 20-35% (p10-p90),
    so a ratio of two 40-step medians moves by a few percent from run to run, as much as the targets' margins.

    `paired`: the two come from the same interleaved rounds (`time_interleaved`), so rounds are resampled whole and a
    slow round slows both; else (steps timed in separate blocks) each is resampled on its own. None under 5 steps."""
    if min(len(times), len(reference)) < 5:
        return None
    from scipy import stats

    def ratio_of_medians(a, b, axis=-1):
        return np.median(a, axis=axis) / np.median(b, axis=axis)

    result = stats.bootstrap((np.asarray(times), np.asarray(reference)), ratio_of_medians, paired=paired,
                             vectorized=True, confidence_level=confidence, n_resamples=2000, method="percentile",
                             rng=np.random.default_rng(0))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def spread(times: list[float]) -> float:
    """(p90 - p10) / median of the timed steps; 0 under 3 of them."""
    if len(times) < 3:
        return 0.0
    low, high = np.percentile(times, [10, 90])
    return float((high - low) / statistics.median(times))
