"""Numbers from training metrics: per-reward series, first step at a threshold, mean and spread over seeds."""

from __future__ import annotations

import itertools
import math
import random
import re
from collections.abc import Iterable, Sequence
from typing import Optional

from recipe.mrtpo.tools.report.discovery import TrainRun

REWARD_METRIC = re.compile(r"^mrtpo/reward/(?P<name>.+)/mean$")


def first_reach(series: dict[int, float], threshold: float) -> Optional[int]:
    """The first step (in step order) whose value is ``>= threshold``; ``None`` if none is (NaN never is)."""
    for step in sorted(series):
        value = series[step]
        if value is not None and math.isfinite(value) and value >= threshold:
            return step
    return None


def reward_series(steps: dict[int, dict[str, float]]) -> dict[str, dict[int, float]]:
    """``{reward name: {step: value}}`` of every ``mrtpo/reward/<name>/mean`` metric."""
    out: dict[str, dict[int, float]] = {}
    for step, metrics in steps.items():
        for key, value in metrics.items():
            m = REWARD_METRIC.match(key)
            if m:
                out.setdefault(m.group("name"), {})[step] = value
    return out


def mean_spread(values: Iterable[float]) -> tuple[Optional[float], Optional[float], int]:
    """(mean, sample standard deviation (ddof 1; ``None`` for fewer than 2), n) of the finite values."""
    vals = [float(v) for v in values if v is not None and math.isfinite(v)]
    n = len(vals)
    if not n:
        return None, None, 0
    mean = sum(vals) / n
    if n < 2:
        return mean, None, n
    return mean, math.sqrt(sum((v - mean) ** 2 for v in vals) / (n - 1)), n


def permutation_p(a: Sequence[float], b: Sequence[float], max_exact: int = 50_000, seed: int = 0) -> Optional[float]:
    """Two-sided permutation p-value of the difference of means of ``a`` and ``b`` (seeds of two methods).

    p = share of the relabelings of the pooled values (``len(a)`` of them to the first group) whose
    ``|mean_1 - mean_2|`` is at least the observed one; the observed labelling counts, so p >= 1/C(n, len(a)).
    Exact over all C(n, len(a)) labellings up to ``max_exact`` of them, else over ``max_exact`` random ones
    (seeded) plus the observed. ``None`` when either side is empty.
    """
    a, b = [float(v) for v in a], [float(v) for v in b]
    if not a or not b:
        return None
    pooled, k, total = a + b, len(a), sum(a) + sum(b)

    def diff(first_sum: float) -> float:
        return abs(first_sum / k - (total - first_sum) / len(b))

    observed = diff(sum(a)) - 1e-9 * (1.0 + abs(total))  # ties count as "at least as extreme"
    if math.comb(len(pooled), k) <= max_exact:
        sums = [sum(c) for c in itertools.combinations(pooled, k)]
    else:
        rng = random.Random(seed)
        sums = [sum(a)] + [sum(rng.sample(pooled, k)) for _ in range(max_exact)]
    return sum(diff(x) >= observed for x in sums) / len(sums)


def curve_stats(runs: list[TrainRun], reward: str) -> dict:
    """Per step: mean, sample std (None under 2 seeds) and n over the runs that logged ``reward``."""
    per_run = [reward_series(r.steps).get(reward, {}) for r in runs]
    steps = sorted({s for series in per_run for s in series})
    out = {"steps": [], "mean": [], "std": [], "n": []}
    for s in steps:
        mean, std, n = mean_spread(series[s] for series in per_run if s in series)
        if n:
            out["steps"].append(s)
            out["mean"].append(mean)
            out["std"].append(std)
            out["n"].append(n)
    return out


def threshold_results(runs: list[TrainRun], reward: str, threshold: float) -> dict:
    """For one method's runs: first step at or above ``threshold`` per run (``None``: never reached;
    runs that never logged ``reward`` are left out), mean over the runs that reached it."""
    per_run = {}
    for r in runs:
        series = reward_series(r.steps).get(reward)
        if series:
            per_run[str(r.seed)] = first_reach(series, threshold)
    reached = [s for s in per_run.values() if s is not None]
    return {
        "per_run": per_run,
        "n_runs": len(per_run),
        "n_reached": len(reached),
        "mean_step": (sum(reached) / len(reached)) if reached else None,
        "not_reached": sorted(k for k, s in per_run.items() if s is None),
    }
