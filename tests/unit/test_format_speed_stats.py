"""experiments/format_speed/stats.py against direct computations: every sign assignment and every relabelling
enumerated here, Holm on a textbook example, the endpoints and the bootstrap re-stated."""

import itertools
import math

import numpy as np
import pytest

from experiments.format_speed import stats


def brute_paired(d):
    obs = abs(sum(d))
    hits = [abs(sum(e * x for e, x in zip(signs, d))) >= obs - 1e-12 for signs in itertools.product((1, -1), repeat=len(d))]
    return sum(hits) / len(hits)


def brute_unpaired(a, b):
    pooled, k = list(a) + list(b), len(a)
    obs = abs(sum(a) / k - sum(b) / len(b))
    hits = []
    for idx in itertools.combinations(range(len(pooled)), k):
        first = [pooled[i] for i in idx]
        rest = [pooled[i] for i in range(len(pooled)) if i not in idx]
        hits.append(abs(sum(first) / k - sum(rest) / len(rest)) >= obs - 1e-12)
    return sum(hits) / len(hits)


@pytest.mark.parametrize("d", [[-5, -4, -6, 2, -3, -1, -7, 0], [1.5, -0.25, 2.0, 0.75, 3.1], [-3], [4, -4], [0, 0, 0],
                               [-17, -5, -2, 9, -4, 0, -8, 1, -9, -6, 3]])
def test_paired_signflip_p_is_the_share_of_all_sign_assignments(d):
    assert stats.paired_signflip_p(d) == pytest.approx(brute_paired(d), abs=1e-12)


def test_paired_signflip_p_bounds_and_empty():
    assert stats.paired_signflip_p([-1] * 10) == pytest.approx(2 / 2**10)  # only all-minus and all-plus as extreme
    assert stats.paired_signflip_p([]) is None
    big = np.random.default_rng(1).normal(-1, 2, 24)  # 2^24 assignments: runs (meet in the middle)
    p = stats.paired_signflip_p(big)
    assert 0 < p <= 1


@pytest.mark.parametrize("a,b", [([19, 21, 23, 25], [14, 16, 17, 31]), ([31, 31, 20], [18, 22, 31, 25, 19]),
                                 ([3, 3, 3], [3, 3]), ([0, -2, 5, 7], [1, 1, 9])])
def test_unpaired_exact_p_is_the_share_of_all_relabellings(a, b):
    r = stats.unpaired_permutation_p(a, b)
    assert r["exact"] and r["p"] == pytest.approx(brute_unpaired(a, b), abs=1e-12)


def test_unpaired_exact_on_the_pilots_committed_per_seed_table():
    # docs/format_speed/toolrl-p32/results.md, censored at 31; its p (exact over all 12,870 relabellings): 0.14
    mrtpo, gdpo = [14, 16, 17, 31, 19, 18, 23, 20], [24, 19, 19, 22, 23, 31, 30, 22]
    r = stats.unpaired_permutation_p(mrtpo, gdpo)
    assert r["p"] == pytest.approx(brute_unpaired(mrtpo, gdpo)) and round(r["p"], 2) == 0.14


def test_unpaired_real_values_fall_back_to_monte_carlo_beyond_the_limit():
    a, b = [0.51, 0.62, 0.55], [0.40, 0.47]
    assert stats.unpaired_permutation_p(a, b)["p"] == pytest.approx(brute_unpaired(a, b))  # few: exact
    rng = np.random.default_rng(0)
    a, b = list(rng.normal(0.6, 0.05, 24)), list(rng.normal(0.55, 0.05, 24))
    r = stats.unpaired_permutation_p(a, b, monte_carlo=2000)
    assert not r["exact"] and 0 < r["p"] <= 1
    assert stats.unpaired_permutation_p([], [1.0]) is None


def test_holm_on_the_textbook_example():
    # four hypotheses, p = 0.01, 0.04, 0.03, 0.005: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03,
    # 0.06, 0.04, running maximum 0.02, 0.03, 0.06, 0.06 (Holm 1979's step-down)
    assert stats.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert stats.holm([0.5, 0.9]) == [1.0, 1.0]
    assert stats.holm([0.02, None]) == [0.02, None]


def test_censoring_and_auc():
    assert stats.censored_steps(None, 30) == 31 and stats.censored_steps(14, 30) == 14
    with pytest.raises(ValueError):
        stats.censored_steps(31, 30)
    series = {k: k / 10 for k in range(1, 11)}
    assert stats.format_auc(series, 10) == pytest.approx(sum(k / 10 for k in range(1, 11)) / 10)
    assert stats.format_auc({1: 0.5}, 2) is None and stats.format_auc({1: 0.5, 2: float("nan")}, 2) is None


def test_bootstrap_interval_is_the_percentiles_of_resampled_means():
    d = [-5.0, -4.0, -6.0, 2.0, -3.0, -1.0, -7.0, 0.0]
    rng = np.random.default_rng(0)
    means = np.array([np.mean([d[i] for i in rng.integers(0, 8, size=8)]) for _ in range(500)])
    lo, hi = stats.bootstrap_interval(d, resamples=500, seed=0)
    assert (lo, hi) == pytest.approx(tuple(np.percentile(means, [2.5, 97.5])))
    lo2, hi2 = stats.bootstrap_interval([1.0, 2.0, 3.0], [0.0, 0.0], resamples=200, seed=3)
    assert lo2 >= 1.0 and hi2 <= 3.0  # b is constant 0: the interval of mean(a)'s resamples
    assert stats.bootstrap_interval([]) is None


def test_the_power_computation_behind_the_plan():
    z = 1.959963984540054 + 0.8416212335729143
    assert stats.seeds_needed(4.0, 4.9) == math.ceil(2 * z**2 * 4.9**2 / 16) == 24
    assert stats.seeds_needed(4.75, 4.9) == 17
    d = stats.detectable_difference(24, 4.9)  # the inverse: 24 seeds detect what needs 24 seeds
    assert stats.seeds_needed(d * 1.0001, 4.9) == 24 and stats.seeds_needed(d * 0.99, 4.9) > 24
    assert stats.normal_power(4.0, 4.9, 24, 24) == pytest.approx(0.807, abs=1e-3)
    assert stats.normal_power(4.0, 4.9, 8, 8) == pytest.approx(0.372, abs=1e-3)
