"""The statistics of the format-speed analysis plan (``docs/format_speed/analysis_plan.md``): pure functions of
per-seed values, each the plan's definition, nothing else (numpy and the standard library).

- :func:`censored_steps`, :func:`format_auc`: the two endpoints of a run;
- :func:`paired_signflip_p`: the exact two-sided paired sign-flip permutation test (the primary test);
- :func:`unpaired_permutation_p`: the exact two-sided permutation test of two independent samples (the fallback);
- :func:`holm`: Holm's step-down adjustment of a family of p-values;
- :func:`bootstrap_interval`: the 95% percentile-bootstrap interval of a mean difference over seeds;
- :func:`normal_power`, :func:`seeds_needed`, :func:`detectable_difference`: the power computation behind the number
  of seeds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist
from typing import Optional

import numpy as np

#: the largest number of pairs :func:`paired_signflip_p` enumerates (2 x 2^20 half-sums)
MAX_PAIRS = 40
#: relabellings of the Monte Carlo fallback of :func:`unpaired_permutation_p` (real-valued data only)
MONTE_CARLO = 200_000


def _tol(values) -> float:
    """Ties count as at least as extreme: a float-sum tolerance relative to the data's size."""
    return 1e-9 * (1.0 + float(np.sum(np.abs(values))))


def censored_steps(first_reach: Optional[int], steps: int) -> int:
    """T = the first step at which the running format mean reaches the threshold, or ``steps + 1`` (censored)
    when no step of the run's ``steps`` did."""
    if first_reach is None:
        return steps + 1
    if not 1 <= int(first_reach) <= steps:
        raise ValueError(f"first_reach {first_reach} outside the run's steps 1..{steps}")
    return int(first_reach)


def format_auc(series: Mapping[int, float], steps: int) -> Optional[float]:
    """AUC = (1 / steps) * sum_{k=1}^{steps} format_k: the mean batch format rate over steps 1..steps (the area
    under the format curve, normalised to [0, 1]); ``None`` when a step is missing or not finite."""
    vals = [series.get(k) for k in range(1, steps + 1)]
    if any(v is None or not math.isfinite(float(v)) for v in vals):
        return None
    return float(sum(float(v) for v in vals) / steps)


def _signed_sums(values: np.ndarray) -> np.ndarray:
    """All 2^len(values) sums sum_i e_i v_i, e_i in {-1, +1}."""
    sums = np.zeros(1)
    for v in values:
        sums = np.concatenate([sums + v, sums - v])
    return sums


def paired_signflip_p(diffs: Sequence[float]) -> Optional[float]:
    """Exact two-sided paired sign-flip permutation p of the mean of the per-seed differences d_s:
    p = #{e in {-1, +1}^n : |sum_s e_s d_s| >= |sum_s d_s|} / 2^n (the observed assignment included, so
    p >= 2 / 2^n). Enumerated exactly by meeting in the middle (two half-sums, one sorted). ``None`` for n = 0."""
    d = np.asarray([float(x) for x in diffs], dtype=float)
    n = len(d)
    if n == 0:
        return None
    if n > MAX_PAIRS:
        raise ValueError(f"paired_signflip_p enumerates at most {MAX_PAIRS} pairs, got {n}")
    t, tol = abs(float(d.sum())), _tol(d)
    if t <= tol:
        return 1.0
    a, b = _signed_sums(d[: n // 2]), np.sort(_signed_sums(d[n // 2:]))
    upper = len(b) - np.searchsorted(b, t - a - tol, side="left")  # a + b >= t
    lower = np.searchsorted(b, -t - a + tol, side="right")  # a + b <= -t
    return float((upper.sum() + lower.sum()) / 2.0**n)


def unpaired_permutation_p(a: Sequence[float], b: Sequence[float], monte_carlo: int = MONTE_CARLO,
                           seed: int = 0) -> Optional[dict]:
    """Two-sided permutation p of mean(a) - mean(b) over the relabellings of the pooled values (len(a) of them to
    the first group): p = #{relabellings with |mean_1 - mean_2| >= observed} / #relabellings.

    Exact over all C(n_a + n_b, n_a) relabellings when every value is an integer (subset sums counted by dynamic
    programming); else over ``monte_carlo`` seeded random relabellings plus the observed one
    (:func:`recipe.mrtpo.tools.report.series.permutation_p`, exact itself when the relabellings are fewer).
    Returns ``{"p", "exact"}``, or ``None`` when a side is empty."""
    a, b = [float(v) for v in a], [float(v) for v in b]
    if not a or not b:
        return None
    pooled = a + b
    if all(v == int(v) for v in pooled):
        return {"p": _exact_integer_p([int(v) for v in a], [int(v) for v in b]), "exact": True}
    from recipe.mrtpo.tools.report.series import permutation_p

    exact = math.comb(len(pooled), len(a)) <= monte_carlo
    return {"p": permutation_p(a, b, max_exact=monte_carlo, seed=seed), "exact": exact}


def _exact_integer_p(a: list[int], b: list[int]) -> float:
    pooled = np.asarray(a + b, dtype=np.int64)
    k, n = len(a), len(pooled)
    low = int(pooled.min())
    shifted = pooled - low  # non-negative sums; the shift adds k * low to every subset of size k
    top = int(shifted.sum())
    counts = np.zeros((k + 1, top + 1), dtype=object)  # counts[j, s]: subsets of size j with shifted sum s
    counts[0, 0] = 1
    for v in shifted.tolist():
        for j in range(k, 0, -1):
            if v == 0:
                counts[j] = counts[j] + counts[j - 1]
            else:
                counts[j, v:] = counts[j, v:] + counts[j - 1, :-v]
    total = float(pooled.sum())
    sums = np.arange(top + 1) + k * low

    def diff(first_sum):
        return np.abs(first_sum / k - (total - first_sum) / (n - k))

    observed = float(diff(float(sum(a))))
    extreme = diff(sums.astype(float)) >= observed - _tol(pooled)
    return float(sum(counts[k, extreme]) / math.comb(n, k))


def holm(pvalues: Sequence[Optional[float]]) -> list[Optional[float]]:
    """Holm's step-down adjustment, in the input's order: with the m p-values sorted p_(1) <= ... <= p_(m),
    adj_(i) = min(1, max_{j <= i} (m - j + 1) p_(j)). ``None`` entries stay ``None`` and do not count in m."""
    idx = sorted((i for i, p in enumerate(pvalues) if p is not None), key=lambda i: pvalues[i])
    m, out, running = len(idx), list(pvalues), 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))
        out[i] = running
    return out


def bootstrap_interval(a: Sequence[float], b: Optional[Sequence[float]] = None, resamples: int = 10_000,
                       seed: int = 0, level: float = 0.95) -> Optional[tuple[float, float]]:
    """The percentile-bootstrap interval of a mean over seeds: of the per-seed differences ``a`` (paired; ``b``
    None), or of mean(a) - mean(b) with each arm resampled on its own (unpaired). ``resamples`` resamples with
    replacement from ``numpy.random.default_rng(seed)`` (a first, then b); the (1 - level)/2 and (1 + level)/2
    percentiles (numpy's linear interpolation). ``None`` when a side is empty."""
    rng = np.random.default_rng(seed)
    x = np.asarray(a, dtype=float)
    if x.size == 0 or (b is not None and len(b) == 0):
        return None
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    if b is not None:
        y = np.asarray(b, dtype=float)
        means = means - y[rng.integers(0, y.size, size=(resamples, y.size))].mean(axis=1)
    lo, hi = np.percentile(means, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return float(lo), float(hi)


def normal_power(delta: float, sd: float, n_a: int, n_b: int, alpha: float = 0.05) -> float:
    """Power of a two-sided test at ``alpha`` of a mean difference ``delta`` between two arms of ``n_a`` and ``n_b``
    seeds with standard deviation ``sd``, normal approximation: Phi(|delta| / (sd sqrt(1/n_a + 1/n_b)) - z_(1-alpha/2))."""
    z = NormalDist()
    return z.cdf(abs(delta) / (sd * math.sqrt(1 / n_a + 1 / n_b)) - z.inv_cdf(1 - alpha / 2))


def seeds_needed(delta: float, sd: float, power: float = 0.8, alpha: float = 0.05) -> int:
    """Seeds a method for ``power`` at ``alpha`` (two-sided, equal arms, normal approximation):
    n = ceil(2 (z_(1-alpha/2) + z_power)^2 sd^2 / delta^2)."""
    z = NormalDist()
    return math.ceil(2 * (z.inv_cdf(1 - alpha / 2) + z.inv_cdf(power)) ** 2 * sd**2 / delta**2)


def detectable_difference(n: float, sd: float, power: float = 0.8, alpha: float = 0.05) -> float:
    """:func:`seeds_needed` solved for delta (before its rounding up): the difference ``n`` seeds a method detect,
    delta = (z_(1-alpha/2) + z_power) sd sqrt(2 / n)."""
    z = NormalDist()
    return (z.inv_cdf(1 - alpha / 2) + z.inv_cdf(power)) * sd * math.sqrt(2 / n)


# ---------------------------------------------------------------- the replication's rank-based tests
# (docs/format_speed/replication_plan.md): the primary is Wilcoxon's signed-rank test, exact, with the sign test
# and the mean's sign-flip test beside it.

def _midranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n of ``x`` (ascending), ties given the mean of the ranks they span."""
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=float)
    xs = x[order]
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def signed_rank_p(diffs: Sequence[float]) -> Optional[dict]:
    """Wilcoxon's signed-rank test of the per-seed differences d_s, exact and two-sided.

    Zero differences are dropped (Wilcoxon's own rule); the n' others are ranked by |d_s| with mid-ranks for ties;
    W+ = sum of the ranks of the positive d_s. Under the null every sign is +-1 with probability 1/2 independently,
    given the ranks, so the exact conditional distribution of W+ is the convolution of n' two-point laws
    {0, r_i}, counted exactly over the 2^n' sign assignments (mid-ranks are multiples of 1/2: doubled, integers).
    p = P(|W+ - E W+| >= |w+ - E W+|) under it (the observed assignment counted). Returns
    ``{"p", "w_plus", "n_nonzero", "n_zero"}``, or ``None`` when every difference is 0 or there are none."""
    d = np.asarray([float(x) for x in diffs], dtype=float)
    nz = d[d != 0]
    if nz.size == 0:
        return None
    ranks2 = np.rint(2 * _midranks(np.abs(nz))).astype(np.int64)  # doubled mid-ranks: integers
    top = int(ranks2.sum())
    counts = np.zeros(top + 1, dtype=object)  # counts[s]: sign assignments whose doubled W+ is s
    counts[0] = 1
    for r in ranks2.tolist():
        counts[r:] = counts[r:] + counts[:-r].copy() if r else counts * 2
    w2 = int(ranks2[nz > 0].sum())
    centre2 = top / 2.0  # E[2 W+] = sum(doubled ranks) / 2
    dev = abs(w2 - centre2)
    s = np.arange(top + 1)
    extreme = np.abs(s - centre2) >= dev - 1e-9
    p = float(sum(counts[extreme]) / 2.0 ** len(ranks2))
    return {"p": min(1.0, p), "w_plus": w2 / 2.0, "n_nonzero": int(nz.size), "n_zero": int(d.size - nz.size)}


def sign_test_p(diffs: Sequence[float]) -> Optional[dict]:
    """The exact two-sided sign test: zeros dropped, k = #{d_s < 0} of the n' others ~ Binomial(n', 1/2) under the
    null; p = sum of the probabilities of every count at most as likely as k's (the observed included), capped at 1.
    Returns ``{"p", "negative", "positive", "zero"}`` or ``None`` when every difference is 0 or there are none."""
    d = [float(x) for x in diffs]
    neg, pos = sum(x < 0 for x in d), sum(x > 0 for x in d)
    n = neg + pos
    if n == 0:
        return None
    probs = [math.comb(n, k) / 2.0**n for k in range(n + 1)]
    p = sum(q for q in probs if q <= probs[neg] * (1 + 1e-12))
    return {"p": min(1.0, p), "negative": neg, "positive": pos, "zero": len(d) - n}


def hodges_lehmann(diffs: Sequence[float]) -> Optional[float]:
    """The Hodges-Lehmann estimate of the centre of the paired differences (the estimator that goes with the
    signed-rank test): the median of the Walsh averages (d_i + d_j) / 2 over i <= j. ``None`` for no data."""
    d = np.asarray([float(x) for x in diffs], dtype=float)
    if d.size == 0:
        return None
    i, j = np.triu_indices(d.size)
    return float(np.median((d[i] + d[j]) / 2.0))


def bootstrap_hl_interval(diffs: Sequence[float], resamples: int = 10_000, seed: int = 0,
                          level: float = 0.95) -> Optional[tuple[float, float]]:
    """The percentile-bootstrap interval of :func:`hodges_lehmann` over seeds (the differences resampled with
    replacement from ``numpy.random.default_rng(seed)``, ``resamples`` times)."""
    d = np.asarray([float(x) for x in diffs], dtype=float)
    if d.size == 0:
        return None
    rng = np.random.default_rng(seed)
    i, j = np.triu_indices(d.size)
    est = np.empty(resamples)
    for b in range(resamples):
        x = d[rng.integers(0, d.size, size=d.size)]
        est[b] = np.median((x[i] + x[j]) / 2.0)
    lo, hi = np.percentile(est, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return float(lo), float(hi)


def simulated_power(draw, n: int, test=lambda d: signed_rank_p(d)["p"] if signed_rank_p(d) else 1.0,
                    alpha: float = 0.05, sims: int = 2000, seed: int = 0) -> float:
    """Power of ``test`` at ``alpha`` on n pairs, by simulation: the share of ``sims`` samples
    ``draw(rng, n) -> n differences`` (``rng`` = ``numpy.random.default_rng(seed)``, shared) whose p is below
    ``alpha``."""
    rng = np.random.default_rng(seed)
    return float(np.mean([test(draw(rng, n)) < alpha for _ in range(sims)]))
